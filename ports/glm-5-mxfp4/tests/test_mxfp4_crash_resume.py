"""kill -9 at every write point of a tiny conversion, rerun, and the output is byte-identical to an
uninterrupted run (the state folder included: plan, claims, unit records)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from packtests import glm_moe_dsa_tiny
from packtests.mxfp4_convert import PORT_ROOT, main, tree


def _cmd(src: Path, dst: Path) -> list[str]:
    return [sys.executable, "-m", "glm5_mxfp4.convert", str(src), str(dst), "--workers", "1", "--quiet"]


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(PORT_ROOT), **extra)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    # one dense layer and one MoE layer: every kind of write point, as few of them as possible
    path = Path(glm_moe_dsa_tiny.make(str(tmp_path_factory.mktemp("src") / "tiny"), num_hidden_layers=2, mtp=False))
    for name in ("generation_config.json", "tokenizer.json", "chat_template.jinja"):  # fewer copies to kill in
        (path / name).unlink()
    return path


def test_kill_at_every_write_point_then_resume(small, tmp_path):
    ref = tmp_path / "ref"
    log = tmp_path / "points.log"
    subprocess.run(_cmd(small, ref), env=_env(GLM5_MXFP4_CRASH_LOG=str(log)), cwd=PORT_ROOT, check=True)
    labels = [line.split("\t", 1)[1] for line in log.read_text().splitlines()]
    expected = tree(ref)
    kinds = {label.split(": ", 1)[-1] for label in labels}
    assert {
        "output opened",
        "first tensor written",
        "data written, before fsync",
        "output fsynced, before rename",
        "output renamed, before record",
        "written, before rename",
        "renamed",
        "written, before link",
    } <= kinds
    assert len(labels) >= 30
    # the killed runs: one process per write point, forked from a runner, each into its own folder
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("crash_runner.py")), str(small), str(tmp_path), str(len(labels))],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in results:
        assert r["signal"] == signal.SIGKILL, f"not killed at point {r['n']} ({labels[r['n'] - 1]}): {r}"
    for n in range(1, len(labels) + 1):
        dst = tmp_path / f"k{n}"
        assert main(small, dst, "--workers", "1", "--quiet") == 0, labels[n - 1]
        assert tree(dst) == expected, f"after a kill at point {n} ({labels[n - 1]})"
