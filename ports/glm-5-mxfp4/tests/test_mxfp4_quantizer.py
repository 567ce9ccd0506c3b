"""The quantizer, bit for bit against torchao 0.18.0 `to_mx`, and its dequantization against
torchao, transformers 5.23.0 and vLLM 0.30.0 (the last in its own process: see vllm030_check.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from glm5_mxfp4 import mxfp4
from packtests import mxfp4_blocks

torchao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402

TORCHAO_MODE = {"floor": ScaleCalculationMode.FLOOR, "even": ScaleCalculationMode.EVEN}
BLOCKS = mxfp4_blocks.blocks()


def torchao_quant(x: torch.Tensor, mode: str):
    scale, data = torchao_mx.to_mx(x, torch.float4_e2m1fn_x2, 32, TORCHAO_MODE[mode])
    return data.view(torch.uint8).numpy(), scale.view(torch.uint8).numpy()


def quantize_rows_whole(x, mode):
    """The converter's path: `quantize_rows` on the calling thread, a few rows per call."""
    x2 = mxfp4.as_bf16_bits(x).reshape(-1, x.shape[-1])
    rows, k = x2.shape
    q = np.full((rows, k // 2), 0xAA, dtype=np.uint8)
    s = np.full((rows, k // 32), 0xAA, dtype=np.uint8)
    for first in range(0, rows, 3):
        mxfp4.quantize_rows(x2, mode, q, s, first, min(first + 3, rows))
    return q.reshape(*x.shape[:-1], k // 2), s.reshape(*x.shape[:-1], k // 32)


@pytest.mark.parametrize("mode", mxfp4.SCALE_MODES)
@pytest.mark.parametrize("case", list(BLOCKS))
def test_bit_exact_with_torchao(case, mode):
    x = BLOCKS[case]
    want_q, want_s = torchao_quant(x, mode)
    for impl in (mxfp4.quantize, quantize_rows_whole, mxfp4.quantize_reference):
        q, s = impl(x, mode)
        assert s.dtype == np.uint8 and q.dtype == np.uint8
        np.testing.assert_array_equal(s, want_s, err_msg=f"{impl.__name__} scales, {case}, {mode}")
        np.testing.assert_array_equal(q, want_q, err_msg=f"{impl.__name__} elements, {case}, {mode}")


@pytest.mark.parametrize("mode", mxfp4.SCALE_MODES)
def test_bit_exact_with_torchao_on_weight_shapes(mode):
    g = torch.Generator().manual_seed(1)
    for shape in ((64, 6144), (192, 2048), (3, 5, 96)):
        x = (torch.randn(*shape, generator=g) * 0.02).bfloat16()
        q, s = mxfp4.quantize(x, mode)
        want_q, want_s = torchao_quant(x, mode)
        np.testing.assert_array_equal(q, want_q)
        np.testing.assert_array_equal(s, want_s)
        q, s = quantize_rows_whole(x, mode)
        np.testing.assert_array_equal(q, want_q)
        np.testing.assert_array_equal(s, want_s)
        assert q.shape == (*shape[:-1], shape[-1] // 2) and s.shape == (*shape[:-1], shape[-1] // 32)


def test_the_modes_differ_where_they_should():
    # amax 7 = 1.75 * 4: FLOOR keeps 2**0 (7 saturates to 6); EVEN rounds amax up to 8, scale 2**1
    x = torch.tensor([[7.0] + [1.0] * 31]).bfloat16()
    assert mxfp4.quantize(x, "floor")[1][0, 0] == 127
    assert mxfp4.quantize(x, "even")[1][0, 0] == 128
    assert mxfp4.dequantize(*mxfp4.quantize(x, "floor"))[0, 0] == 6.0
    assert mxfp4.dequantize(*mxfp4.quantize(x, "even"))[0, 0] == 8.0


def test_ties_round_to_even_and_saturate():
    x = torch.tensor([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.03125, -7.9375] + [0.0] * 22]).bfloat16()
    deq = mxfp4.dequantize(*mxfp4.quantize(x, "floor"))[0, :10]
    np.testing.assert_array_equal(deq, [6, 0, 1, 1, 2, 2, 4, 4, 6, -6])


def test_packing_low_nibble_is_the_even_element():
    x = torch.tensor([[0.5, 6.0] + [0.0] * 30]).bfloat16()  # scale 2**0: codes 1 and 7
    q, s = mxfp4.quantize(x, "floor")
    assert s[0, 0] == 127 and q[0, 0] == 0x71


@pytest.mark.parametrize("mode", mxfp4.SCALE_MODES)
def test_dequantize_equals_torchao_and_transformers(mode):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    x = mxfp4_blocks.all_blocks()
    q, s = mxfp4.quantize(x, mode)
    ours = mxfp4.dequantize(q, s)
    ao = torchao_mx.to_dtype(
        torch.from_numpy(q), torch.from_numpy(s).view(torch.float8_e8m0fnu), torch.float4_e2m1fn_x2, 32, torch.float32
    )
    np.testing.assert_array_equal(ours, ao.numpy())
    rows, k = x.shape
    # transformers reads gpt-oss blocks [experts, rows, K/32, 16] and returns [experts, K, rows]
    tf = convert_moe_packed_tensors(
        torch.from_numpy(q).reshape(1, rows, k // 32, 16),
        torch.from_numpy(s).reshape(1, rows, k // 32),
        dtype=torch.float32,
    )
    np.testing.assert_array_equal(ours, tf[0].transpose(0, 1).numpy())
    # every value is exact in bf16 too (what the converted model is loaded as)
    np.testing.assert_array_equal(torch.from_numpy(ours).bfloat16().float().numpy(), ours)


def test_non_finite_values_are_refused_with_their_first_index():
    x = torch.zeros(4, 64).bfloat16()
    x[2, 37] = float("nan")
    x[3, 1] = float("inf")
    for impl in (mxfp4.quantize, quantize_rows_whole, mxfp4.quantize_reference):
        with pytest.raises(mxfp4.NonFiniteError) as info:
            impl(x, "even")
        assert info.value.index == (2, 37)


def test_block_axis_must_be_a_multiple_of_32():
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4.quantize(torch.zeros(4, 48).bfloat16(), "even")


def test_scale_comes_from_exponent_bits_not_an_e8m0_cast():
    # amax 1.5 * 4 and 3 * 4: an e8m0 cast of the scale would round 1.5 -> 2, 3 -> 4
    x = torch.tensor([[6.0] + [0.0] * 31, [12.0] + [0.0] * 31]).bfloat16()
    _, s = mxfp4.quantize(x, "floor")
    assert list(s[:, 0]) == [127, 128]


def test_even_has_the_lower_error_on_weight_like_data():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 4096, generator=g) * 0.02).bfloat16()
    floor, even = mxfp4.relative_error(x, "floor"), mxfp4.relative_error(x, "even")
    assert 0.10 < even < floor < 0.12


def test_the_kernels_code_formula_equals_the_threshold_rule_for_every_normal_scale():
    a = np.arange(0x7F80, dtype=np.int64)  # every finite magnitude
    for code in range(mxfp4.FORMULA_MIN_CODE, 254):
        t = mxfp4._THRESHOLDS[code].astype(np.int64)
        rule = sum((a >= t[i]) if up else (a > t[i]) for i, up in enumerate(mxfp4._TIE_UP))
        np.testing.assert_array_equal(mxfp4.magnitude_codes(a, code), rule, err_msg=f"scale code {code}")


# The edges `dequantize` and the README's format section state. bf16 bit patterns: 0x7F60 is
# 1.75 * 2**127, 0x7F5F the next value below it, 0x7F7F the bf16 maximum, 0x7F40 1.5 * 2**127,
# 0x7EC0 1.5 * 2**126; 0x0180 is 2**-124, 0x0160 1.75 * 2**-125, 0x0080 2**-126 (smallest normal).
TOP = np.array([0x7F40, 0x7F5F, 0x7F60, 0x7F7F, 0xFF60, 0xFF5F, 0x7EC0, 0x3F80] + [0] * 24, dtype=np.uint16)
TINY = np.array([0x0140, 0x0100, 0x0080, 0x0040, 0x0060, 0x0020, 0x0021, 0x8080] + [0] * 24, dtype=np.uint16)


def nibbles(q: np.ndarray) -> np.ndarray:
    return np.stack([q & 15, q >> 4], axis=-1).reshape(*q.shape[:-1], q.shape[-1] * 2)


def every_impl(bits: np.ndarray, mode: str):
    """(scale codes, element codes) of a [rows, 32] bit array, the same from all three implementations."""
    x = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    q, s = mxfp4.quantize(x, mode)
    for impl in (quantize_rows_whole, mxfp4.quantize_reference):
        q2, s2 = impl(x, mode)
        np.testing.assert_array_equal(q2, q)
        np.testing.assert_array_equal(s2, s)
    return s, q


def test_even_top_edge_scale_253_and_inf_from_1_75_x_2_127():
    s, q = every_impl(TOP[None], "even")
    assert s.tolist() == [[253]]  # the rounded amax is 2**128: X = 128 - 2
    # /2**126: 3, 3.48 (below the 3.5 tie), 3.5 (tie -> 4), 3.98, -3.5, -3.48, 1.5, 2**-126 -> 0
    assert nibbles(q)[0, :8].tolist() == [5, 5, 6, 6, 14, 13, 3, 0]
    deq = mxfp4.dequantize(q, s)[0]
    big = np.float32(2.0**126)
    np.testing.assert_array_equal(deq[:8], [3 * big, 3 * big, np.inf, np.inf, -np.inf, -3 * big, 1.5 * big, 0])
    assert np.isinf(deq).tolist() == [bits >= 0x7F60 for bits in TOP & 0x7FFF]  # exactly |v| >= 1.75 * 2**127


def test_even_just_below_the_top_edge_saturates_finite():
    block = TOP.copy()
    block[2:5] = [0x7F5F, 0x7F5F, 0xFF5F]  # amax 0x7F5F: rounds to 2**127, not 2**128
    s, q = every_impl(block[None], "even")
    assert s.tolist() == [[252]]
    assert nibbles(q)[0, :8].tolist() == [7, 7, 7, 7, 15, 15, 5, 0]  # /2**125: 6, 6.97 saturate to 6
    assert np.isfinite(mxfp4.dequantize(q, s)).all()


def test_floor_top_edge_scale_252_all_finite():
    s, q = every_impl(TOP[None], "floor")
    assert s.tolist() == [[252]]
    assert nibbles(q)[0, :8].tolist() == [7, 7, 7, 7, 15, 15, 5, 0]  # /2**125: 6 and up saturate to 6
    deq = mxfp4.dequantize(q, s)[0]
    assert np.isfinite(deq).all() and deq.max() == np.float32(1.5 * 2.0**127)


@pytest.mark.parametrize("mode", mxfp4.SCALE_MODES)
def test_scale_code_0_divides_by_2_pow_minus_126_and_decodes_at_half(mode):
    s, q = every_impl(TINY[None], mode)
    assert s.tolist() == [[0]]
    # /2**-126: 3, 2, 1, 0.5, 0.75 (tie up to 1), 0.25 (tie down to 0), 0.2578, -1
    assert nibbles(q)[0, :8].tolist() == [5, 4, 2, 1, 2, 0, 1, 10]
    deq = mxfp4.dequantize(q, s)[0, :3]
    np.testing.assert_array_equal(deq, np.float32([3 * 2.0**-127, 2 * 2.0**-127, 2.0**-127]))  # half of v


@pytest.mark.parametrize(("mode", "last_code_0", "first_code_1"), [("floor", 0x017F, 0x0180), ("even", 0x015F, 0x0160)])
def test_where_scale_code_0_ends(mode, last_code_0, first_code_1):
    blocks = np.zeros((3, 32), dtype=np.uint16)
    blocks[1, 7] = last_code_0
    blocks[2, 7] = first_code_1 | 0x8000
    s, _ = every_impl(blocks, mode)
    assert s[:, 0].tolist() == [0, 0, 1]


@pytest.mark.parametrize("mode", mxfp4.SCALE_MODES)
def test_edges_bit_exact_with_torchao(mode):
    blocks = np.stack([TOP, TINY, np.where(np.arange(32) == 2, 0x7F5F, TOP).astype(np.uint16)])
    x = torch.from_numpy(blocks.view(np.int16).copy()).view(torch.bfloat16)
    want_q, want_s = torchao_quant(x, mode)
    q, s = mxfp4.quantize(x, mode)
    np.testing.assert_array_equal(s, want_s)
    np.testing.assert_array_equal(q, want_q)


def test_edges_against_vllm_030_triton_quantizer_in_the_interpreter():
    """vLLM 0.30.0's `downcast_to_mxfp` (Triton, CPU interpreter; see vllm030_quantize.py): equal
    bytes on ordinary blocks, and the two stated differences."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from fixpack.errors import SourceUnavailable
    from fixpack.sources import sources

    pytest.importorskip("triton", reason="vLLM's quantizer is a Triton kernel")
    try:
        tree = sources.wheel_tree("vllm", "0.30.0", "vllm")
    except SourceUnavailable as exc:
        pytest.skip(f"vLLM 0.30.0 wheel unavailable: {exc}")
    g = torch.Generator().manual_seed(2)
    ordinary = mxfp4.as_bf16_bits((torch.randn(64, 32, generator=g) * 0.02).bfloat16())
    bits = np.concatenate([TOP[None], TINY[None], ordinary])
    script = Path(__file__).resolve().parent / "vllm030_quantize.py"
    path = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(script), str(tree)],
        input=json.dumps(bits.tolist()),
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["file"].startswith(str(tree))
    vq, vs = np.array(res["q"], dtype=np.uint8), np.array(res["s"], dtype=np.uint8)
    q, s = mxfp4.quantize(torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16), "even")
    np.testing.assert_array_equal(vs[2:], s[2:])
    np.testing.assert_array_equal(vq[2:], q[2:])
    # top edge: X clamped to 127 (code 254, ours 253); /2**127: 1.5, 1.74 -> 1.5, 1.75 -> 2 (tie), 1.99 -> 2,
    # 0.75 -> 1 (tie); the same decoded values from 2**127 up, infs included, not below (1.5 * 2**126)
    assert vs[0].tolist() == [254] and s[0].tolist() == [253]
    assert nibbles(vq)[0, :8].tolist() == [3, 3, 4, 4, 12, 11, 2, 0]
    theirs, ours = mxfp4.dequantize(vq[:1], vs[:1])[0], mxfp4.dequantize(q[:1], s[:1])[0]
    np.testing.assert_array_equal(theirs[:6], ours[:6])
    assert theirs[6] == np.float32(2.0**127) and ours[6] == np.float32(1.5 * 2.0**126)
    # code 0: both write it; vLLM multiplies by 2**127 where we divide by 2**-126 (normal elements only:
    # the interpreter's result for bf16 subnormals is not what a GPU is known to do)
    assert vs[1].tolist() == [0] and s[1].tolist() == [0]
    assert nibbles(vq)[1, [0, 1, 2, 7]].tolist() == [7, 6, 4, 12]
    assert nibbles(q)[1, [0, 1, 2, 7]].tolist() == [5, 4, 2, 10]
