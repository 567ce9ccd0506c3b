"""What the port's op tests on the emulated card share: they activate the Habana emulation in their
own pytest process (it changes torch process-wide), so they run only where HPU_EMULATION_IN_PROCESS=1
says the process is theirs (scripts/test.sh, stage mxfp4-runner)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def require_own_process() -> None:
    """Skip the calling test module unless the emulation may be activated in this process."""
    if str(REPO / "emulation") not in sys.path:
        sys.path.insert(0, str(REPO / "emulation"))
    pytest.importorskip("hpu_emulation.device")
    if os.environ.get("HPU_EMULATION_IN_PROCESS") != "1":
        pytest.skip(
            "activates the Habana emulation in this process: run in a pytest process of its own with "
            "HPU_EMULATION_IN_PROCESS=1 (scripts/test.sh, stage mxfp4-runner)",
            allow_module_level=True,
        )
    if not getattr(sys.modules.get("habana_frameworks"), "__hpu_emulation__", True):
        pytest.skip("a real habana_frameworks is imported here", allow_module_level=True)


def activate():
    """The emulation on, the hpu device registered as the bridge registers it; its counters."""
    import hpu_emulation

    hpu_emulation.activate()
    import habana_frameworks.torch  # noqa: F401

    from hpu_emulation import counting

    return counting
