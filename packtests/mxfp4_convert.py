"""The glm5_mxfp4 converter as its tests run it: in this process (``main``), as a user runs it (a
new process from the port folder, ``run_cli``), and the digest of every file it wrote (``tree``)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from glm5_mxfp4 import convert

PORT_ROOT = Path(__file__).resolve().parents[1] / "ports" / "glm-5-mxfp4"


def run_cli(*args, env=None, check=False) -> subprocess.CompletedProcess:
    """The command line as a user runs it: a new process, from the port folder."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = str(PORT_ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "glm5_mxfp4.convert", *map(str, args)],
        cwd=PORT_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def main(*args) -> int:
    return convert.main([str(a) for a in args])


def tree(root: Path, hidden: bool = True) -> dict[str, str]:
    """sha256 of every file under root (the state folder too unless hidden=False)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and (hidden or not rel.startswith(".")):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
