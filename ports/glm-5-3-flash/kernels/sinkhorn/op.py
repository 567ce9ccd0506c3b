"""Loader for the mHC Sinkhorn TPC kernel (torch.ops.hpu_glm.mhc_sinkhorn), independent of
glm5_next_hpu so the kernel can be checked on its own.

    from op import mhc_sinkhorn, kernel_status   # or load this file by path
    comb = mhc_sinkhorn(comb, eps=1e-6, iters=20)

`mhc_sinkhorn` runs the kernel when the built library loaded and the tensor is on HPU; in
every other case (no build, no Gaudi software, a CPU tensor) it runs `sinkhorn_tpc_order`, the
same operation order in PyTorch (see sinkhorn_f32.c's header). It never raises for a missing
kernel; `kernel_status()` says which path is in effect and why.

The library is found at $GLM5_NEXT_SINKHORN_LIB, else build/libhpu_glm_sinkhorn.so beside this
file. The graph-compiler glue (build/libcustom_tpc_glm.so) is prepended to GC_KERNEL_PATH at
load time; this must happen before the process first acquires the device, which is the case
when the plugin loads (vLLM loads general plugins before it builds the model).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
LIB_ENV = "GLM5_NEXT_SINKHORN_LIB"
OP_LIB = "libhpu_glm_sinkhorn.so"
TPC_LIB = "libcustom_tpc_glm.so"

_state: dict = {"tried": False, "loaded": False, "why": "not tried"}


def library_path() -> Path:
    env = os.environ.get(LIB_ENV)
    return Path(env) if env else HERE / "build" / OP_LIB


def load() -> bool:
    """Load the op library once. True when torch.ops.hpu_glm.mhc_sinkhorn is usable."""
    if _state["tried"]:
        return _state["loaded"]
    _state["tried"] = True
    lib = library_path()
    if not lib.is_file():
        _state["why"] = f"{lib} not built (run ports/glm-5-3-flash/kernels/sinkhorn/build.sh on a Gaudi image)"
        return False
    try:
        import habana_frameworks.torch  # noqa: F401  (registers the HPU device and the custom-op runtime)
    except ImportError as exc:
        _state["why"] = f"Gaudi software not importable ({exc})"
        return False
    tpc = lib.with_name(TPC_LIB)
    if tpc.is_file():
        paths = [p for p in os.environ.get("GC_KERNEL_PATH", "").split(":") if p]
        if str(tpc) not in paths:
            os.environ["GC_KERNEL_PATH"] = ":".join([str(tpc), *paths])
    else:
        _state["why"] = f"{tpc} missing (the graph-compiler glue is built with the op library)"
        return False
    try:
        torch.ops.load_library(str(lib))
        torch.ops.hpu_glm.mhc_sinkhorn  # noqa: B018  (resolves the schema)
    except Exception as exc:  # a broken or mismatched build must not take the server down
        _state["why"] = f"{lib} failed to load: {exc}"
        return False
    _state.update(loaded=True, why=f"loaded {lib}")
    return True


def kernel_status() -> dict:
    load()
    return {"kernel": _state["loaded"], "why": _state["why"], "library": str(library_path())}


def sinkhorn_tpc_order(comb: torch.Tensor, iters: int = 20, eps: float = 1e-6) -> torch.Tensor:
    """The kernel's operation order in PyTorch, element by element (fp32 [..., 4, 4]).

    Rows: pairwise (c0 + c1) + (c2 + c3); columns: sequential ((c0 + c1) + c2) + c3; eps added
    to the finished sum; x * reciprocal(s + eps); one column step, then iters - 1 (row, column).
    Kept identical to glm5_next_hpu.mhc.sinkhorn_tpc_order (test_op.py checks it).
    """
    if comb.shape[-2:] != (4, 4):
        raise ValueError(f"Sinkhorn is defined here for [..., 4, 4], got {tuple(comb.shape)}")
    c = [[comb[..., i, j] for j in range(4)] for i in range(4)]

    def col(c):
        r = [torch.reciprocal(((c[0][j] + c[1][j]) + c[2][j]) + c[3][j] + eps) for j in range(4)]
        return [[c[i][j] * r[j] for j in range(4)] for i in range(4)]

    def row(c):
        r = [torch.reciprocal((c[i][0] + c[i][1]) + (c[i][2] + c[i][3]) + eps) for i in range(4)]
        return [[c[i][j] * r[i] for j in range(4)] for i in range(4)]

    c = col(c)
    for _ in range(iters - 1):
        c = col(row(c))
    return torch.stack([torch.stack(r, dim=-1) for r in c], dim=-2)


def mhc_sinkhorn(comb: torch.Tensor, eps: float = 1e-6, iters: int = 20) -> torch.Tensor:
    """Sinkhorn of fp32 [..., 4, 4]: the TPC kernel on HPU when loaded, else the same order in torch."""
    if comb.device.type == "hpu" and comb.dtype == torch.float32 and load():
        return torch.ops.hpu_glm.mhc_sinkhorn(comb, float(eps), int(iters))
    return sinkhorn_tpc_order(comb, iters, eps)
