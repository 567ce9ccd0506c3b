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

import os
from pathlib import Path

import torch

from glm5_hpu import mxk

HERE = Path(__file__).resolve().parent
OP_LIB = "libhpu_glm_mxfp4.so"
TPC_LIB = "libcustom_tpc_glm_mxfp4.so"
MAX_TOKENS = 16  # MXK_MAX_TOKENS in mxfp4_gemv_bf16.c: the GEMV is for decode-sized calls

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
    tpc = lib.with_name(TPC_LIB)
    if not tpc.is_file():
        _state["why"] = f"{tpc} missing (build.sh builds it with the op library)"
        return False
    try:
        import habana_frameworks.torch  # noqa: F401  (the HPU device and the custom-op runtime)
    except ImportError as exc:
        _state["why"] = f"Gaudi software not importable ({exc})"
        return False
    paths = [p for p in os.environ.get("GC_KERNEL_PATH", "").split(":") if p]
    if str(tpc) not in paths:
        os.environ["GC_KERNEL_PATH"] = ":".join([str(tpc), *paths])
    try:
        torch.ops.load_library(str(lib))
        torch.ops.hpu_glm.mxfp4_gemv  # noqa: B018  (resolves the schemas)
        torch.ops.hpu_glm.mxfp4_unpack  # noqa: B018
    except Exception as exc:  # a broken or mismatched build must not take the server down
        _state["why"] = f"{lib} failed to load: {exc}"
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
