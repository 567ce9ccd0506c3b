"""A functional emulation of Intel Gaudi's PyTorch bridge (``habana_frameworks``) on the CPU.

``overlay/`` holds the ``habana_frameworks`` package tree that vllm-gaudi imports; :func:`activate`
puts it on ``sys.path`` (and on ``PYTHONPATH`` for child processes), so nothing imports the
emulation by accident. Importing ``habana_frameworks.torch`` then registers the ``hpu`` device
(:func:`activate_device`), as Intel's bridge does.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

OVERLAY = Path(__file__).resolve().parent / "overlay"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _prepend_pythonpath(*paths: Path) -> None:
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [str(p) for p in paths if str(p) not in current]
    os.environ["PYTHONPATH"] = os.pathsep.join(new + current)


def activate() -> None:
    """Make ``import habana_frameworks`` load the emulation, here and in child processes."""
    for path in (PACKAGE_ROOT, OVERLAY):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    _prepend_pythonpath(OVERLAY, PACKAGE_ROOT)
    stub = sys.modules.get("habana_frameworks")
    if stub is not None and not getattr(stub, "__hpu_emulation__", False):
        raise RuntimeError(
            "habana_frameworks is already imported from elsewhere "
            f"({getattr(stub, '__file__', stub)!r}); activate the emulation before anything imports it"
        )


def activate_device() -> None:
    """Register ``torch.hpu`` and the ``hpu`` device kernels, the hpu ops, ``hccl`` and ``hpu_backend``."""
    import habana_frameworks.torch.hpu as hpu_module

    from hpu_emulation import device, distributed

    device.install(hpu_module)
    try:
        from hpu_emulation import ops
    except ImportError:  # the kernels module is optional for the device layer's own tests
        ops = None  # type: ignore[assignment]
    if ops is not None:
        ops.register()
    distributed.register_hccl()
    distributed.register_hpu_backend()


__all__ = ["OVERLAY", "activate", "activate_device", "types"]
