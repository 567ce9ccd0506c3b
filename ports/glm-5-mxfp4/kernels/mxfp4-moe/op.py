"""Loader of the MXFP4 MoE TPC kernels' PyTorch ops (torch.ops.hpu_glm.mxfp4_gemv and
mxfp4_unpack), with the kernels' operation order in PyTorch (glm5_hpu.mxk) wherever they cannot
run.

    import op                      # this folder on sys.path (gate.py), or load this file by path
    y = op.mxfp4_gemv(x, packed, scales)     # bf16 [T, K] x MXFP4 [N, K] -> bf16 [T, N]
    w = op.mxfp4_unpack(packed, scales)      # MXFP4 [N, K] -> bf16 [N, K]

Each runs the kernel when the built library loaded and the tensors are on HPU, and
glm5_hpu.mxk (the same order on any device) otherwise; it never raises for a missing kernel,
and kernel_status() says which path is in effect and why. The library is
build/libhpu_glm_mxfp4.so beside this file unless load() is given another path. Loading
prepends build/libcustom_tpc_glm_mxfp4.so to GC_KERNEL_PATH, which the graph compiler reads
when the process first acquires the device: load before that.
"""

from __future__ import annotations

from pathlib import Path

import torch

from glm5_hpu import hpu_mxk, mxk

HERE = Path(__file__).resolve().parent
OP_LIB = hpu_mxk.OP_LIB
TPC_LIB = hpu_mxk.TPC_LIB  # the TPC kernels beside the op library
MAX_TOKENS = hpu_mxk.DECODE_MAX  # the GEMV is for decode-sized calls

_state: dict = {"tried": False, "loaded": False, "why": "not tried", "library": str(HERE / "build" / OP_LIB)}


def load(library: Path | None = None) -> bool:
    """Load the op library once (the first call's path wins). True when the ops are usable."""
    if _state["tried"]:
        return _state["loaded"]
    _state["tried"] = True
    lib = Path(library) if library else HERE / "build" / OP_LIB
    _state["library"] = str(lib)
    if not lib.is_file():
        _state["why"] = f"{lib} not built (run ports/glm-5-mxfp4/kernels/mxfp4-moe/build.sh in a Gaudi image)"
        return False
    problem = hpu_mxk.load_library(lib)
    if problem is not None:
        _state["why"] = problem
        return False
    _state.update(loaded=True, why=f"loaded {lib}")
    return True


def kernel_status() -> dict:
    load()
    return {"kernel": _state["loaded"], "why": _state["why"], "library": _state["library"]}


def mxfp4_gemv(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [T, N] = x @ W^T for x bf16 [T, K]: the GEMV kernel on HPU when loaded (T <= 16),
    else glm5_hpu.mxk.gemv_bf16 (the same order)."""
    if x.device.type == "hpu" and load():
        if x.shape[0] > MAX_TOKENS:
            raise ValueError(
                f"mxfp4_gemv: {x.shape[0]} tokens; the kernel takes at most {MAX_TOKENS} (decode-sized calls)"
            )
        return torch.ops.hpu_glm.mxfp4_gemv(x, packed, scales)
    return mxk.gemv_bf16(x, packed, scales)


def mxfp4_unpack(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [N, K]: the unpack kernel on HPU when loaded, else glm5_hpu.mxk.unpack_bf16."""
    if packed.device.type == "hpu" and load():
        return torch.ops.hpu_glm.mxfp4_unpack(packed, scales)
    return mxk.unpack_bf16(packed, scales)
