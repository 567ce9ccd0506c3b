"""The mHC Sinkhorn op ``hpu_glm::mhc_sinkhorn`` that ``GLM5_NEXT_MHC_SINKHORN=kernel`` calls.

On a Gaudi image with the kernel built (``kernels/sinkhorn/build.sh``, run by install.sh) the op
is the TPC kernel's library (``libhpu_glm_sinkhorn.so``, HPU and Meta implementations), loaded by
``kernels/sinkhorn/op.py``. Everywhere else (CPU, or HPU without the build) the same op name is
defined here with one implementation for every device: the kernel's operation order in PyTorch
(``mhc.sinkhorn_tpc_order``), which ``kernels/sinkhorn/test_host_c.py`` checks bit for bit against
the kernel's own C source compiled for the host. So the model always calls the op; what backs it
is reported by :func:`status` and logged once.

The library is looked for at ``$GLM5_NEXT_SINKHORN_LIB``, then in the checkout's
``kernels/sinkhorn/build/``, then under ``$COOKBOOK/ports/glm-5-3-flash/`` (the image).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

NAMESPACE, NAME = "hpu_glm", "mhc_sinkhorn"
SCHEMA = "(Tensor comb, float eps, int iters) -> Tensor"
_state: dict[str, str | None] = {"backend": None, "why": "not loaded"}
_lib = None  # keeps the Python definition alive


def _kernel_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("GLM5_NEXT_SINKHORN_LIB"):
        dirs.append(Path(os.environ["GLM5_NEXT_SINKHORN_LIB"]).parent.parent)
    dirs.append(Path(__file__).resolve().parents[1] / "kernels" / "sinkhorn")
    if os.environ.get("COOKBOOK"):
        dirs.append(Path(os.environ["COOKBOOK"]) / "ports" / "glm-5-3-flash" / "kernels" / "sinkhorn")
    return dirs


def _try_kernel_library() -> str | None:
    """Load the built kernel through kernels/sinkhorn/op.py; None when loaded, else why not."""
    reasons = []
    for d in _kernel_dirs():
        loader = d / "op.py"
        if not loader.is_file():
            continue
        spec = importlib.util.spec_from_file_location("glm5_next_sinkhorn_kernel_op", loader)
        if spec is None or spec.loader is None:
            reasons.append(f"{loader} cannot be imported")
            continue
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if not os.environ.get("GLM5_NEXT_SINKHORN_LIB") and (d / "build" / mod.OP_LIB).is_file():
            os.environ["GLM5_NEXT_SINKHORN_LIB"] = str(d / "build" / mod.OP_LIB)
        if mod.load():
            return None
        reasons.append(mod.kernel_status()["why"])
    return "; ".join(reasons) or "kernels/sinkhorn/op.py not found"


def _define_emulation() -> None:
    global _lib
    from .mhc import sinkhorn_tpc_order

    _lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    _lib.define(NAME + SCHEMA)

    def emulation(comb: torch.Tensor, eps: float, iters: int) -> torch.Tensor:
        return sinkhorn_tpc_order(comb, iters, eps)

    # One implementation for every device and for meta tensors: the kernel's order in PyTorch.
    _lib.impl(NAME, emulation, "CompositeExplicitAutograd")


def ensure_op() -> str:
    """Make torch.ops.hpu_glm.mhc_sinkhorn callable; return its backend: 'kernel' or 'emulation'."""
    known = _state["backend"]
    if known is not None:
        return known
    if hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), NAME):
        backend, why = "kernel", "hpu_glm::mhc_sinkhorn was already registered"
    elif (why_not := _try_kernel_library()) is None:
        backend, why = "kernel", "the TPC kernel library is loaded"
    else:
        _define_emulation()
        backend, why = "emulation", f"the kernel's operation order in PyTorch ({why_not})"
        level = logging.WARNING if _habana_present() else logging.INFO
        logger.log(level, "GLM5_NEXT_MHC_SINKHORN=kernel: hpu_glm::mhc_sinkhorn is %s", why)
    _state.update(backend=backend, why=why)
    return backend


def _habana_present() -> bool:
    return importlib.util.find_spec("habana_frameworks") is not None


def status() -> dict:
    return {"backend": _state["backend"], "why": _state["why"]}


def mhc_sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn of fp32 [..., 4, 4] through the op (the kernel, or its emulation)."""
    ensure_op()
    return torch.ops.hpu_glm.mhc_sinkhorn(comb, float(eps), int(iters))


__all__ = ["ensure_op", "mhc_sinkhorn", "status"]
