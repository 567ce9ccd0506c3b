"""glm5_hpu.mxk, the MXFP4 MoE TPC kernels' operation order on CPU (kernels/mxfp4-moe/).

* the kernels' integer decode is the converter's dequantization (glm5_mxfp4.mxfp4.dequantize)
  and the reference path's (glm5_hpu.moe_mxfp4.dequantize) bit for bit, for every byte under
  every scale code; the unpack kernel's bf16 words are the reference's bf16 dequantization;
* the GEMV's float32 sums are exact where every partial sum is exact, and within the float32
  accumulation bound of a float64 reference otherwise; an expert's output through the emulated
  kernels equals the reference MoE path's within a stated bf16 tolerance;
* negative controls: a scale exponent off by one, swapped nibbles, a corrupted scale in an
  expert: each comparison above reports them;
* the kernel sources themselves, compiled unchanged with g++ against a host stand-in of the TPC
  intrinsics (tpc_host/): their bf16 outputs and their float32 sums equal the emulation's bit for
  bit, and a copy with one step out of the contract's order is reported;
* the kernel folder: op.py falls back to this order without a build, build.sh refuses without
  the toolchain (exit 3) and is shellcheck-clean, gate.py cannot run without a card (exit 2),
  and the sources' constants are these.

The host build shows the sources do what the contract says given the stand-in's reading of each
intrinsic; whether the card's intrinsics agree is the device gate's question:
kernels/mxfp4-moe/gate.py (gate "mxk").
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from glm5_hpu import moe_mxfp4, mxk
from glm5_hpu.moe_mxfp4 import MxfpExperts
from glm5_mxfp4 import mxfp4

PORT = Path(__file__).resolve().parents[1]
KERNELS = PORT / "kernels" / "mxfp4-moe"
U = 2.0**-24  # float32 unit roundoff


def every_byte_under_every_code() -> tuple[torch.Tensor, torch.Tensor]:
    """Row r: the 256 byte values twice (512 elements), all under scale code r."""
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 1)
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 16)
    return packed, scales


def bit_mismatches(got: torch.Tensor, want: torch.Tensor) -> int:
    """Elements whose bits differ, NaN matching NaN (the decode's code 255)."""
    g_nan, w_nan = torch.isnan(got), torch.isnan(want)
    width = torch.int32 if got.dtype == torch.float32 else torch.int16
    differ = (got.view(width) != want.view(width)) & ~(g_nan & w_nan)
    return int(differ.sum())


def converter_decode(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    with np.errstate(over="ignore"):  # the converter's code 255 (NaN) path
        return torch.from_numpy(mxfp4.dequantize(packed.numpy(), scales.numpy()))


def swap_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return ((packed & 0x0F) << 4) | (packed >> 4)


def quantized(rows: int, k: int, seed: int, std: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
    """The converter's MXFP4 of N(0, std) bf16 weights [rows, k]."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, k, generator=g) * std).to(torch.bfloat16)
    q, s = mxfp4.quantize(w)
    return torch.from_numpy(q), torch.from_numpy(s)


# --------------------------------------------------------------------------- decode and unpack
@pytest.mark.filterwarnings("ignore:overflow encountered in ldexp")
def test_decode_is_the_converters_and_the_reference_paths_for_every_byte_under_every_scale_code():
    packed, scales = every_byte_under_every_code()
    got = mxk.decode(packed, scales)
    assert got.dtype == torch.float32 and got.shape == (256, 512)
    assert bit_mismatches(got, converter_decode(packed, scales)) == 0
    assert bit_mismatches(got, moe_mxfp4.dequantize(packed, scales)) == 0
    nan = torch.isnan(got)
    assert bool(nan[255].all()) and not bool(nan[:255].any())
    # the corners the integer recipe handles on its own (byte b's low nibble is element 2b):
    # code 0's subnormals, -0, overflow to inf
    low = got[:, 0::2]
    assert low[0, 0x01].item() == 2.0**-128 and low[0, 0x07].item() == 6 * 2.0**-127
    assert str(low[127, 0x08].item()) == "-0.0"
    assert low[254, 0x07].item() == float("inf") and low[254, 0x0F].item() == float("-inf")  # 6 * 2**127
    assert low[254, 0x03].item() == 3 * 2.0**126  # 1.5 * 2**127, still finite


@pytest.mark.filterwarnings("ignore:overflow encountered in ldexp")
def test_unpack_is_the_reference_bf16_dequantization_bit_for_bit():
    packed, scales = every_byte_under_every_code()
    got = mxk.unpack_bf16(packed, scales)
    assert got.dtype == torch.bfloat16 and got.shape == (256, 512)
    assert bit_mismatches(got, moe_mxfp4.dequantize(packed, scales, torch.bfloat16)) == 0
    assert bit_mismatches(got.float(), converter_decode(packed, scales)) == 0  # the bf16 words are exact
    q, s = quantized(96, 6144, seed=1)  # a w13-like expert block as the converter writes it
    assert bit_mismatches(mxk.unpack_bf16(q, s), moe_mxfp4.dequantize(q, s, torch.bfloat16)) == 0


def test_negative_controls_a_scale_exponent_off_by_one_and_swapped_nibbles_are_reported():
    q, s = quantized(64, 512, seed=2)
    want = moe_mxfp4.dequantize(q, s)
    nonzero = int((want != 0).sum())
    assert bit_mismatches(mxk.decode(q, s), want) == 0
    assert bit_mismatches(mxk.decode(q, s + 1), want) == nonzero  # every non-zero weight doubled
    assert bit_mismatches(mxk.unpack_bf16(q, s - 1), moe_mxfp4.dequantize(q, s, torch.bfloat16)) == nonzero
    swapped_bytes = int(((q & 0x0F) != (q >> 4)).sum())
    assert bit_mismatches(mxk.decode(swap_nibbles(q), s), want) == 2 * swapped_bytes > 0


def test_bad_shapes_and_dtypes_are_refused():
    q, s = quantized(4, 64, seed=3)
    with pytest.raises(ValueError, match="do not match"):
        mxk.decode(q, s[:, :1])
    with pytest.raises(TypeError, match="uint8"):
        mxk.decode(q.to(torch.int16), s)
    with pytest.raises(TypeError, match="bf16"):
        mxk.gemv_bf16(torch.zeros(2, 64), q, s)
    with pytest.raises(ValueError, match="x \\(2, 32\\)"):
        mxk.gemv_bf16(torch.zeros(2, 32, dtype=torch.bfloat16), q, s)


# --------------------------------------------------------------------------- GEMV
def float64_reference(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x @ W^T, |x| @ |W|^T) in float64, W the converter's dequantization."""
    w = converter_decode(packed, scales).double()
    return x.double() @ w.t(), x.double().abs() @ w.abs().t()


def accumulation_bound(k: int, abs_sum: torch.Tensor) -> torch.Tensor:
    """The kernel's float32 sums against the exact sum: n adds on any path (2 per 128-element
    chunk, 6 in the lane fold), each rounding once, products exact: |error| <= n u sum |x w|
    (to first order; the 1.01 covers the higher-order terms at these n)."""
    n = 2 * -(-k // (2 * mxk.LANES)) + 6
    return 1.01 * n * U * abs_sum


def check_gemv_bound(x, packed, scales, reference=None) -> float:
    """Assert the emulated GEMV's float32 sums and bf16 outputs are within the bound of the
    float64 reference (of the weights ``reference`` = (packed, scales), default the same);
    return the largest error as a fraction of the accumulation bound."""
    ref, abs_sum = float64_reference(x, *(reference or (packed, scales)))
    acc = mxk.gemv_accumulate(x, packed, scales)
    bound = accumulation_bound(x.shape[1], abs_sum)
    err = (acc.double() - ref).abs()
    assert bool((err <= bound).all()), f"float32 sums off by up to {float((err / bound).max()):.3g} x the bound"
    y = mxk.gemv_bf16(x, packed, scales)
    assert torch.equal(y, acc.to(torch.bfloat16))
    # the bf16 store adds at most half a bf16 ulp: 2**-8 of the float32 sum (8 significant bits)
    assert bool(((y.double() - ref).abs() <= bound + 2.0**-8 * acc.double().abs()).all())
    return float((err / bound.clamp(min=1e-300)).max())


def test_gemv_is_exact_where_every_partial_sum_is_exact():
    # integer activations, weights of scale 1 (code 127): every product and partial sum is a
    # multiple of 0.5 well inside float32's 24 bits, so the order cannot round anything
    g = torch.Generator().manual_seed(4)
    for k in (64, 96, 256, 1024):
        x = torch.randint(-3, 4, (5, k), generator=g).to(torch.bfloat16)
        packed = torch.randint(0, 256, (40, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
        scales = torch.full((40, k // 32), 127, dtype=torch.uint8)
        ref, _ = float64_reference(x, packed, scales)
        acc = mxk.gemv_accumulate(x, packed, scales)
        assert torch.equal(acc.double(), ref), k
        assert torch.equal(mxk.gemv_bf16(x, packed, scales), ref.float().to(torch.bfloat16))
        # negative controls: the same exact comparison reports swapped nibbles and a scale off by one
        assert not torch.equal(mxk.gemv_accumulate(x, swap_nibbles(packed), scales).double(), ref)
        bad = scales.clone()
        bad[7, 0] += 1
        diff = mxk.gemv_accumulate(x, packed, bad).double() != ref
        assert bool(diff[:, 7].any()) and not bool(diff[:, :7].any()) and not bool(diff[:, 8:].any())


@pytest.mark.parametrize("k", [96, 160, 512, 2048])
def test_gemv_is_within_the_float32_accumulation_bound_of_float64(k):
    q, s = quantized(64, k, seed=k)
    for t in (1, 3, 16):
        x = torch.randn(t, k, generator=torch.Generator().manual_seed(t)).to(torch.bfloat16)
        assert check_gemv_bound(x, q, s) <= 1.0


def test_the_bound_check_reports_a_corrupted_scale():
    q, s = quantized(64, 512, seed=5)
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    assert check_gemv_bound(x, q, s) <= 1.0
    bad = s.clone()
    bad[11, 3] += 1  # row 11's fourth block decoded at twice its scale
    with pytest.raises(AssertionError, match="off by up to"):
        check_gemv_bound(x, q, bad, reference=(q, s))
    with pytest.raises(AssertionError, match="off by up to"):
        check_gemv_bound(x, swap_nibbles(q), s, reference=(q, s))


def test_the_lane_order_is_the_contracts():
    # K = 256 (two chunks), every weight 1.0 (nibble 2, code 127); x is 1 at element 0 (chunk 0,
    # lane 0) and 2**-24 at elements 2, 3 (chunk 0, lane 1) and 128, 129 (chunk 1, lane 0).
    # The contract: lane 0 = (1 + 2**-24) + 2**-24 = 1 (each add a tie, to even); lane 1 =
    # 2**-24 + 2**-24 = 2**-23; the fold adds lane 1 to lane 0 last (h = 1): 1 + 2**-23.
    # Element order would give 1 (every 2**-24 lost against 1); the exact sum is 1 + 2**-22.
    k = 256
    x = torch.zeros(1, k)
    x[0, 0] = 1.0
    x[0, 2] = x[0, 3] = x[0, 128] = x[0, 129] = 2.0**-24
    x = x.to(torch.bfloat16)
    packed = torch.full((1, k // 2), 0x22, dtype=torch.uint8)
    scales = torch.full((1, k // 32), 127, dtype=torch.uint8)
    assert mxk.gemv_accumulate(x, packed, scales).item() == 1.0 + 2.0**-23
    assert float(float64_reference(x, packed, scales)[0].item()) == 1.0 + 2.0**-22
    in_order = torch.zeros((), dtype=torch.float32)
    for v in x.float()[0]:  # element order, for contrast
        in_order = in_order + v
    assert in_order.item() == 1.0


# --------------------------------------------------------------------------- against the MoE reference
def emulated_experts_forward(experts: MxfpExperts, x, ids, weights, w2_scale=None):
    """MxfpExperts.forward with both projections on the emulated GEMV (bf16 activations)."""
    w2_scale = experts.w2_scale if w2_scale is None else w2_scale
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        s = experts.slot[e]
        kpos, tok = torch.nonzero(ids.t() == e, as_tuple=True)
        gate, up = mxk.gemv_bf16(x[tok], experts.w13[s], experts.w13_scale[s]).chunk(2, dim=-1)
        y = mxk.gemv_bf16(F.silu(gate) * up, experts.w2[s], w2_scale[s]) * weights[tok, kpos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def expert_tolerance(ref: torch.Tensor) -> torch.Tensor:
    """4 bf16 ulps of the row's largest output: the two paths' float32 sums round to the same or
    adjacent bf16 values, and silu, the product and the second projection can carry that to a
    few ulps of the row's scale (measured: at most 2, see the test)."""
    return 4 * 2.0**-7 * ref.float().abs().amax(dim=-1, keepdim=True)


def test_emulated_kernels_give_the_reference_moe_expert_output():
    hidden, inter, n_exp, tokens, top_k = 256, 160, 6, 16, 2  # inter 160: a partial last chunk
    g = torch.Generator().manual_seed(6)
    parts = {}
    for name, (rows, k) in {"w13": (2 * inter, hidden), "w2": (hidden, inter)}.items():
        qs = [quantized(rows, k, seed=100 * i + rows) for i in range(n_exp)]
        parts[name] = torch.stack([q for q, _ in qs])
        parts[name + "_scale"] = torch.stack([s for _, s in qs])
    experts = MxfpExperts(list(range(n_exp)), parts["w13"], parts["w13_scale"], parts["w2"], parts["w2_scale"])
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(n_exp, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g)
    ref = experts.forward(x, ids, weights)
    got = emulated_experts_forward(experts, x, ids, weights)
    tol = expert_tolerance(ref)
    err = (got.float() - ref.float()).abs()
    assert bool((err <= tol).all()), float((err / tol).max())
    ulps = float((err / (2.0**-7 * ref.float().abs().amax(dim=-1, keepdim=True))).max())
    print(
        f"{int((got != ref).sum())} of {ref.numel()} outputs differ; largest difference "
        f"{ulps:.3f} bf16 ulps of the row's largest output"
    )
    assert ulps <= 2.0, ulps  # the figure the tolerance's docstring states
    # negative control: one scale code of one routed expert off by one (output 7, first block)
    bad = experts.w2_scale.clone()
    bad[int(ids[0, 0]), 7, 0] += 1
    err_bad = (emulated_experts_forward(experts, x, ids, weights, w2_scale=bad).float() - ref.float()).abs()
    assert not bool((err_bad <= tol).all())
    assert not bool((err_bad[:, :7] > tol).any()) and not bool((err_bad[:, 8:] > tol).any())


# --------------------------------------------------------------------------- the kernel folder
@pytest.fixture()
def op():
    spec = importlib.util.spec_from_file_location("mxfp4_moe_op_under_test", KERNELS / "op.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_op_without_the_library_runs_the_emulation_and_says_why(op, tmp_path):
    assert op.load(tmp_path / "libhpu_glm_mxfp4.so") is False
    status = op.kernel_status()
    assert (
        status["kernel"] is False and "not built" in status["why"] and status["library"].endswith("libhpu_glm_mxfp4.so")
    )
    q, s = quantized(32, 160, seed=7)
    x = torch.randn(3, 160, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    assert torch.equal(op.mxfp4_gemv(x, q, s), mxk.gemv_bf16(x, q, s))
    assert torch.equal(op.mxfp4_unpack(q, s).view(torch.int16), mxk.unpack_bf16(q, s).view(torch.int16))


def test_the_sources_constants_are_the_emulations(op):
    gemv = (KERNELS / "mxfp4_gemv_bf16.c").read_text()
    glue = (KERNELS / "mxfp4_glue.cpp").read_text()
    host = (KERNELS / "hpu_glm_mxfp4.cpp").read_text()
    assert re.search(r"^#define LANES (\d+)$", gemv, re.M).group(1) == str(mxk.LANES)
    for text, pattern in (
        (gemv, r"#define MXK_MAX_TOKENS (\d+)"),
        (glue, r"kMaxTokens = (\d+);"),
        (host, r"kMaxTokens = (\d+);"),
    ):
        assert re.search(pattern, text).group(1) == str(op.MAX_TOKENS)
    for guid in ("glm_mxfp4_gemv_bf16_gaudi2", "glm_mxfp4_unpack_bf16_gaudi2"):
        assert f'"{guid}"' in glue and f'"{guid}"' in host
    assert re.search(r"MXFP4_NAN_BITS 0x7FC00000", (KERNELS / "mxfp4_decode.h").read_text())


def run_build(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TPC_CLANG="/nonexistent/tpc-clang", TPC_INCLUDE="", HABANA_INCLUDE="")
    return subprocess.run(["bash", str(KERNELS / "build.sh"), *args], capture_output=True, text=True, env=env)


def test_build_sh_refuses_without_the_toolchain_and_builds_nothing():
    before = (KERNELS / "build").exists()
    for args in (("--check",), ("--variant", "glm"), ()):
        proc = run_build(*args)
        assert proc.returncode == 3, proc.stderr
        assert "cannot build here; missing:" in proc.stderr and "tpc-clang" in proc.stderr
        assert "GLM_MXK=0 GLM_MXK_PREFILL=0" in proc.stderr
    proc = run_build("--variant", "gpt-oss")
    assert proc.returncode == 2 and "the only variant is glm" in proc.stderr
    assert (KERNELS / "build").exists() == before


def test_build_sh_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([shellcheck, str(KERNELS / "build.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_device_gate_cannot_run_here_and_says_so():
    if importlib.util.find_spec("habana_frameworks") is not None:
        pytest.skip("Gaudi software present: the gate is run by tests/hpu/run_gates.sh --only mxk")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PORT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(KERNELS / "gate.py")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "mxk gate: cannot run" in proc.stdout and "pass" not in proc.stdout


# --------------------------------------------------------------------------- the sources, built on the host
HOST = Path(__file__).resolve().parent / "tpc_host"


def build_host_kernel(out: Path, kernel_dir: Path, gemv: bool, f32_out: bool = False) -> Path:
    """The kernel source in ``kernel_dir``, unchanged, against the host stand-in of the TPC
    intrinsics (tpc_host/tpc_shim.hpp), as an executable; ``f32_out``: the GEMV writes its
    float32 sums instead of rounding them to bf16."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the kernel sources on the host")
    exe = out / ("gemv" + ("_f32" if f32_out else "") if gemv else "unpack")
    flags = [
        "-std=c++17",
        "-O1",
        "-fno-strict-aliasing",
        "-ffp-contract=off",
        "-fwrapv",
        "-Wall",
        "-Werror",
        "-Wno-unknown-pragmas",
    ]
    if gemv:
        flags += ["-DGEMV", *(["-DF32_OUT", "-DF32_TO_BF16_RNE(v)=(v)"] if f32_out else [])]
    cmd = [cxx, *flags, f"-I{kernel_dir}", f"-I{HOST}", str(HOST / "run_kernel.cpp"), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exe


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    out = tmp_path_factory.mktemp("tpc_host")
    return {
        "gemv": build_host_kernel(out, KERNELS, True),
        "gemv_f32": build_host_kernel(out, KERNELS, True, True),
        "unpack": build_host_kernel(out, KERNELS, False),
    }


def run_host_gemv(exe: Path, x, packed, scales, tmp: Path, f32: bool = False) -> torch.Tensor:
    t, k = x.shape
    n = packed.shape[0]
    # the op's preparation (hpu_glm_mxfp4.cpp): x[t, 2j + h] -> xs[t, h, j] in fp32
    x.float().view(t, k // 2, 2).transpose(1, 2).contiguous().numpy().tofile(tmp / "xs")
    packed.numpy().tofile(tmp / "packed")
    scales.numpy().tofile(tmp / "scales")
    args = [str(exe), str(n), str(k), str(t), *(str(tmp / f) for f in ("xs", "packed", "scales", "y"))]
    subprocess.run(args, check=True)
    y = torch.from_numpy(np.fromfile(tmp / "y", dtype=np.float32 if f32 else np.int16).reshape(n, t)).t().contiguous()
    return y if f32 else y.view(torch.bfloat16)


def run_host_unpack(exe: Path, packed, scales, tmp: Path) -> torch.Tensor:
    n, half = packed.shape
    packed.numpy().tofile(tmp / "packed")
    scales.numpy().tofile(tmp / "scales")
    subprocess.run([str(exe), str(n), str(2 * half), *(str(tmp / f) for f in ("packed", "scales", "out"))], check=True)
    return torch.from_numpy(np.fromfile(tmp / "out", dtype=np.int32).reshape(n, half)).view(torch.bfloat16)


def random_weights(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(112, 132, (n, k // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    return packed, scales


def test_the_kernel_sources_built_on_the_host_give_the_emulations_bits(host_kernels, tmp_path):
    g = torch.Generator().manual_seed(8)
    # K 6,144 and 1,024: GLM-5.3's w13 and w2 at GLM_MOE_TP=2; 96 and 160: a partial last chunk
    for n, k, t in ((48, 6144, 16), (128, 1024, 5), (8, 96, 3), (16, 160, 1), (4, 64, 2)):
        packed, scales = random_weights(n, k, g)
        x = torch.randn(t, k, generator=g).to(torch.bfloat16)
        got = run_host_gemv(host_kernels["gemv"], x, packed, scales, tmp_path)
        assert torch.equal(got.view(torch.int16), mxk.gemv_bf16(x, packed, scales).view(torch.int16)), (n, k, t)
        sums = run_host_gemv(host_kernels["gemv_f32"], x, packed, scales, tmp_path, f32=True)
        assert torch.equal(sums.view(torch.int32), mxk.gemv_accumulate(x, packed, scales).view(torch.int32)), (n, k, t)
        got = run_host_unpack(host_kernels["unpack"], packed, scales, tmp_path)
        assert torch.equal(got.view(torch.int16), mxk.unpack_bf16(packed, scales).view(torch.int16)), (n, k)
    packed, scales = every_byte_under_every_code()  # NaN (code 255), subnormals, inf included: the same bits
    got = run_host_unpack(host_kernels["unpack"], packed, scales, tmp_path)
    assert torch.equal(got.view(torch.int16), mxk.unpack_bf16(packed, scales).view(torch.int16))


LO_THEN_HI = """float64 p_lo = x_lo * w_lo;
                float64 a = acc[t] + p_lo;
                acc[t] = SEL_F32_LT(j, k_elems / 2, a, acc[t]);
                float64 p_hi = x_hi * w_hi;
                a = acc[t] + p_hi;"""
HI_THEN_LO = LO_THEN_HI.replace("_lo", "_@").replace("_hi", "_lo").replace("_@", "_hi")


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("the fold by doubling", "for (int h = LANES / 2; h >= 1; h /= 2)", "for (int h = 1; h < LANES; h *= 2)"),
        ("the high element first", LO_THEN_HI, HI_THEN_LO),
        (
            "scales spread by 8 lanes",
            "SHUFFLE_I32(U8_QUARTER_TO_I32(sb, 0), lane >> 4)",
            "SHUFFLE_I32(U8_QUARTER_TO_I32(sb, 0), lane >> 3)",
        ),
    ],
)
def test_a_kernel_source_out_of_the_contracts_order_is_reported(tmp_path, name, old, new):
    # negative control: the same comparison on a copy of the source with one step changed
    src = tmp_path / "src"
    shutil.copytree(KERNELS, src, ignore=shutil.ignore_patterns("build"))
    text = (src / "mxfp4_gemv_bf16.c").read_text()
    assert text.count(old) == 1, name
    (src / "mxfp4_gemv_bf16.c").write_text(text.replace(old, new))
    exe = build_host_kernel(tmp_path, src, True, f32_out=True)
    g = torch.Generator().manual_seed(9)
    packed, scales = random_weights(64, 1024, g)
    x = torch.randn(8, 1024, generator=g).to(torch.bfloat16)
    sums = run_host_gemv(exe, x, packed, scales, tmp_path, f32=True)
    differ = int((sums.view(torch.int32) != mxk.gemv_accumulate(x, packed, scales).view(torch.int32)).sum())
    assert differ > 0, name
