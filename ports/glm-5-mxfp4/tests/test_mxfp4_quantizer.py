"""The quantizer, bit for bit against torchao 0.18.0 `to_mx`, and its dequantization against
torchao, transformers 5.23.0 and vLLM 0.30.0 (the last in its own process: see vllm030_check.py)."""

from __future__ import annotations

import mxfp4_blocks
import numpy as np
import pytest
import torch
from glm5_mxfp4 import mxfp4

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
    ao = torchao_mx.to_dtype(torch.from_numpy(q), torch.from_numpy(s).view(torch.float8_e8m0fnu),
                             torch.float4_e2m1fn_x2, 32, torch.float32)
    np.testing.assert_array_equal(ours, ao.numpy())
    rows, k = x.shape
    # transformers reads gpt-oss blocks [experts, rows, K/32, 16] and returns [experts, K, rows]
    tf = convert_moe_packed_tensors(torch.from_numpy(q).reshape(1, rows, k // 32, 16),
                                    torch.from_numpy(s).reshape(1, rows, k // 32), dtype=torch.float32)
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
