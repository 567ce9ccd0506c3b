"""sinkhorn: the Sinkhorn TPC kernel's own device test, as its folder provides it."""

from __future__ import annotations

import sys
from pathlib import Path

from .client import Client, Result, run_script


def sinkhorn_command(sinkhorn_dir: Path) -> list[str] | None:
    """The kernel's device test, as its folder provides it: gate.py, a package run with
    python -m, run_gate.sh, or a pytest file test_device*.py."""
    py = sys.executable
    if (sinkhorn_dir / "gate.py").is_file():
        return [py, str(sinkhorn_dir / "gate.py")]
    if (sinkhorn_dir / "__main__.py").is_file() and (sinkhorn_dir / "__init__.py").is_file():
        return [py, "-m", sinkhorn_dir.name]
    if (sinkhorn_dir / "run_gate.sh").is_file():
        return ["bash", str(sinkhorn_dir / "run_gate.sh")]
    tests = sorted(sinkhorn_dir.glob("test_device*.py"))
    if tests:
        return [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *map(str, tests)]
    return None


def gate_sinkhorn(client: Client | None, opts) -> Result:
    cmd = opts.sinkhorn_cmd.split() if opts.sinkhorn_cmd else sinkhorn_command(opts.sinkhorn_dir)
    if cmd is None:
        return Result(
            "sinkhorn", "missing", f"no gate.py, __main__.py, run_gate.sh or test_device*.py in {opts.sinkhorn_dir}"
        )
    result, figures, details = run_script(
        cmd, opts.script_timeout, cwd=opts.sinkhorn_dir.parent if "-m" in cmd[:2] else None
    )
    return Result("sinkhorn", result, figures, details)
