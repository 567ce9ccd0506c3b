"""A functional emulation of Intel Gaudi's PyTorch bridge (``habana_frameworks``) on the CPU.

``overlay/`` holds the ``habana_frameworks`` package tree that vllm-gaudi imports; it is put on
``sys.path`` (and on ``PYTHONPATH`` for child processes) by :func:`activate`, never installed
under that name, so nothing imports the emulation by accident.
"""

from __future__ import annotations

from pathlib import Path

OVERLAY = Path(__file__).resolve().parent / "overlay"
