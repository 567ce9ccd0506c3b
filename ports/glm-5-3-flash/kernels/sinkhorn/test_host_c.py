"""The kernel's C source (sinkhorn_f32.c), compiled unchanged for the host with the TPC names of
host/tpc_host.h, against the op GLM5_NEXT_MHC_SINKHORN=kernel calls on CPU
(``glm5_next_hpu.sinkhorn_op``: the kernel's order in PyTorch): bit for bit, 1 to 1,024 matrices
(lane tails included). The host stands in for the TPC only in the reciprocal (IEEE 1/x); whether the
TPC's v_reciprocal_f32 rounds the same is the sinkhorn device gate's question.

Also: the switch reaches the op (the model's mHC calls it, counted), and the reference loop (x / y
instead of x * reciprocal, torch.sum's order) is *not* bit-identical to the kernel: the comparison
can fail."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def _compiler() -> str | None:
    for cc in ("gcc", "cc", "clang"):
        if shutil.which(cc):
            return cc
    return None


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler on this machine")
    lib = tmp_path_factory.mktemp("sinkhorn") / "libsinkhorn_host.so"
    # -ffp-contract=off: every add and multiply rounds on its own, as build.sh compiles the kernel.
    cmd = [
        cc,
        "-O2",
        "-ffp-contract=off",
        "-fPIC",
        "-shared",
        "-Wno-unknown-pragmas",
        "-Wno-psabi",
        "-o",
        str(lib),
        str(HERE / "host" / "host_driver.c"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    so = ctypes.CDLL(str(lib))
    so.sinkhorn_host.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int]

    def run(comb: torch.Tensor, eps: float, iters: int) -> torch.Tensor:
        rows = comb.shape[0]
        src = comb.reshape(rows, 16).t().contiguous()  # [16, R], as the op hands it to the kernel
        out = torch.full_like(src, float("nan"))
        so.sinkhorn_host(src.data_ptr(), out.data_ptr(), rows, eps, iters)
        return out.t().reshape(rows, 4, 4)

    return run


def comb(rows: int, seed: int, spread: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, 4, 4, generator=g) * spread, dim=-1) + 1e-6


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("rows", [1, 3, 63, 64, 65, 200, 1024])
def test_the_op_on_cpu_is_the_kernel_bit_for_bit(kernel, rows):
    from glm5_next_hpu.sinkhorn_op import ensure_op

    assert ensure_op() == "emulation"  # no built kernel here: the op is the PyTorch order
    for seed, spread in ((rows, 3.0), (rows + 1, 12.0)):  # mild and near-one-hot matrices
        x = comb(rows, seed, spread)
        got = torch.ops.hpu_glm.mhc_sinkhorn(x, 1e-6, 20)
        want = kernel(x, 1e-6, 20)
        assert torch.equal(bits(got), bits(want)), f"{(bits(got) != bits(want)).sum()} elements differ"


def test_iterations_and_eps_are_the_kernels(kernel):
    x = comb(64, 7)
    for eps, iters in ((1e-6, 1), (1e-3, 5), (0.0, 20)):
        assert torch.equal(bits(torch.ops.hpu_glm.mhc_sinkhorn(x, eps, iters)), bits(kernel(x, eps, iters)))


def test_the_reference_loop_is_not_the_kernel(kernel):
    from glm5_next_hpu.mhc import sinkhorn

    x = comb(1024, 11, 12.0)
    assert not torch.equal(bits(sinkhorn(x, 20, 1e-6)), bits(kernel(x, 1e-6, 20)))
    torch.testing.assert_close(sinkhorn(x, 20, 1e-6), kernel(x, 1e-6, 20), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tpc_order, calls", [(True, 1), (False, 0)], ids=["kernel", "torch"])
def test_the_switch_calls_the_op(tpc_order, calls):
    from torch.utils._python_dispatch import TorchDispatchMode

    from glm5_next_hpu.mhc import hc_pre

    class Calls(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "hpu_glm":
                Calls.n += 1
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    N, D = 4, 8
    X = torch.randn(1, 5, N, D, generator=g)
    fn, base, scale = torch.randn((2 + N) * N, N * D, generator=g) * 0.1, torch.zeros((2 + N) * N), torch.ones(3)
    with Calls():
        hc_pre(X, fn, base, scale, rms_eps=1e-5, hc_eps=1e-6, iters=20, tpc_order=tpc_order)
    assert Calls.n == calls
