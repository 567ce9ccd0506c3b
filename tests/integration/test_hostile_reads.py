"""Reads that never block, explode or crash, trees of any shape, and a fix's text escaped
(issue 41, items 3, 4 and 6), through the CLI, with the kernel layers and without.

Each hostile case of packtests/hostile_cases.py that issue 41 added runs here in both sandbox
modes (the rule is the driver's, so the outcome must not depend on the kernel layers); the
cases on the state folder (backups, journal, state record, lock) and on the bytes handed to a
fix follow. Every case checks the exit code, the message naming the file, that nothing hangs
(each command runs under a timeout), no traceback, the tree, and that nothing is left behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import time

import pytest

from fixpack.apply.store import Store
from packtests import builders as B
from packtests import reliability_lib as L
from packtests.hostile_cases import CASES, run_case
from packtests.sandbox_cases import PRELUDE

ISSUE_41 = [
    "output-symlink-to-fifo",
    "output-symlink-to-dev-zero",
    "output-is-folder",
    "output-is-fifo",
    "output-missing",
    "stage-3000-deep",
    "stage-wide",
    "stage-symlinks-out",
    "deep-folder-in-package",
    "error-with-terminal-escapes",
    "output-with-terminal-escapes",
    "undeclared-name-with-escapes",
]
MODES = ["auto", "hook"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case_id", ISSUE_41)
def test_a_hostile_stage_or_tree_is_refused_by_name_in_both_modes(tmp_path, case_id, mode):
    case = next(c for c in CASES if c.id == case_id)
    t0 = time.monotonic()
    run_case(dataclasses.replace(case, env={"FIXPACK_SANDBOX": mode}), tmp_path)
    assert time.monotonic() - t0 < 110  # the CLI's own timeout is 120 s: no read waited for ever


def test_without_the_kernel_a_fix_making_a_3000_deep_chain_in_the_tree_is_undone_whole(tmp_path):
    """Hook mode lets a fix's process write the tree (ctypes goes around the audit hook): the
    snapshot must find the chain, at any depth, remove it all and fail the fix, naming it."""
    root, tree = L.copy_pack("codemod-first", tmp_path)
    from packtests.hostile_cases import Ctx

    ctx = Ctx(root, tree, tmp_path / "outside", tmp_path / "outside" / "pwned")
    body = PRELUDE + (
        "os.chdir(T.decode() + '/pkg_a')\n"
        "for _ in range(3000):\n"
        "    if libc.mkdir(b'deep', 0o755) != 0: fail('mkdir')\n"
        "    os.chdir('deep')\n"
        "return node"
    )
    ctx.codemod(body)
    B.forge_lock(root, "fix-two")
    before = B.tree_digest(tree)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root,
                  env={"FIXPACK_SANDBOX": "hook", "FIXPACK_TEST_TREE": str(tree)})  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert f"{tree / 'pkg_a' / 'deep'}: created (63 entries in it, and folders nested deeper than 64 levels); restored (removed)" in out, out
    assert len(out) < 4000  # one line for the chain, not one per folder
    assert "Traceback" not in out
    assert not (tree / "pkg_a" / "deep").exists() and B.tree_digest(tree) == before


# ---- the state folder: backups, journal, state record, lock


def _applied(tmp_path):
    root, tree = L.copy_pack("basic", tmp_path)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    return root, tree, Store(tree / ".fixpack")


def _plant(kind: str, path, tmp_path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "symlink-to-fifo":
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    elif kind == "folder":
        path.mkdir()
    elif kind == "sparse-16g":
        with open(path, "wb") as f:
            f.truncate(16 << 30)
    elif kind == "char-device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:
            pytest.skip("no CAP_MKNOD here")
    else:
        raise ValueError(kind)


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-fifo", "symlink-to-dev-zero", "char-device", "folder", "sparse-16g"])
def test_a_backup_that_is_no_regular_file_stops_revert_by_name_at_once(tmp_path, kind):
    root, tree, store = _applied(tmp_path)
    state = json.loads(store.state_path.read_text())
    before = state["steps"][-1]["files"]
    rel, (h, _) = sorted(before.items())[0]
    _plant(kind, store.objects / h[:2] / h[2:], tmp_path)
    digest = B.tree_digest(tree)
    t0 = time.monotonic()
    r = B.fixpack("revert", "--all", "--profile", "test", "--root", str(tree), pack=root, timeout=60)
    out = r.stdout + r.stderr
    assert time.monotonic() - t0 < 50
    assert r.returncode == 5, out
    assert f"backup {store.objects / h[:2] / h[2:]} is " in out and "cannot restore those exact bytes" in out, out
    assert "Traceback" not in out and B.tree_digest(tree) == digest


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-zero", "sparse-16g"])
def test_a_journal_that_is_no_regular_file_or_huge_is_unreadable_not_read(tmp_path, kind):
    root, tree, store = _applied(tmp_path)
    _plant(kind, store.journal_path, tmp_path)
    digest = B.tree_digest(tree)
    t0 = time.monotonic()
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, timeout=60)
    out = r.stdout + r.stderr
    assert time.monotonic() - t0 < 50
    assert r.returncode == 5 and f"{store.journal_path} is unreadable" in out, out
    v = B.fixpack("verify", "--profile", "test", "--root", str(tree), pack=root, timeout=60)
    assert v.returncode == 5 and "interrupted" in v.stdout, v.stdout + v.stderr
    assert B.tree_digest(tree) == digest


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-fifo", "sparse-16g"])
def test_a_state_record_that_is_no_regular_file_is_corrupt_and_apply_rebuilds_it(tmp_path, kind):
    root, tree, store = _applied(tmp_path)
    _plant(kind, store.state_path, tmp_path)
    v = B.fixpack("verify", "--profile", "test", "--root", str(tree), pack=root, timeout=60)
    assert v.returncode == 5 and f"state record {store.state_path} is corrupt" in v.stdout, v.stdout + v.stderr
    a = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, timeout=60)
    assert a.returncode == 0 and "is corrupt; working out the applied fixes from file hashes" in a.stdout, a.stdout + a.stderr
    assert stat.S_ISREG(os.lstat(store.state_path).st_mode)  # replaced by rename, never written through
    assert B.fixpack("verify", "--profile", "test", "--root", str(tree), pack=root).returncode == 0


def test_the_state_folder_owner_is_checked_before_its_files_are_read(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving the state folder to another user needs root")
    root, tree, store = _applied(tmp_path)
    _plant("fifo", store.state_path, tmp_path)  # a read before the check would hang here
    os.chown(store.dir, 4321, 4321)
    for cmd in ("verify", "apply"):
        r = B.fixpack(cmd, "--profile", "test", "--root", str(tree), pack=root, timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode == 6 and f"{store.dir}: the state folder is owned by uid 4321" in out, out


def test_the_run_lock_is_private(tmp_path):
    root, tree, store = _applied(tmp_path)
    assert stat.S_IMODE(os.stat(store.lock_path).st_mode) == 0o600
    os.chmod(store.lock_path, 0o644)  # as an earlier version made it
    r = B.fixpack("revert", "--all", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert stat.S_IMODE(os.stat(store.lock_path).st_mode) == 0o600


# ---- the bytes a fix gets are the bytes hashed


def test_a_target_swapped_after_it_was_hashed_is_drift_and_the_fix_is_not_blamed(tmp_path, monkeypatch):
    """The driver reads a target once: the bytes it hashes and checks against the pins are the
    bytes it hands to the fix's process. A target swapped after that read (the package folders'
    owner, mid-run) never reaches the fix; the commit's re-check finds the swap (exit 5, no fix
    blamed), where a second read by path gave the fix other bytes and blamed it (exit 4)."""
    from fixpack.apply.engine import Engine
    from fixpack.cli.main import main

    root, tree = L.copy_pack("basic", tmp_path)
    lock = json.loads((root / "profiles" / "test.lock.json").read_text())
    real = Engine.run_worker
    seen = {}

    def swapping(self, fix, inputs, pins=None, hashes=None):
        for rel in inputs:
            seen[rel] = hashlib.sha256(inputs[rel]).hexdigest()
            (tree / rel).write_bytes((tree / rel).read_bytes() + b"# swapped after the hash\n")
        return real(self, fix, inputs, pins, hashes)

    monkeypatch.setattr(Engine, "run_worker", swapping)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    rc = main(["apply", "--profile", "test", "--root", str(tree), "--pack", str(root)])
    assert rc == 5
    assert seen and all(seen[rel] == lock["pristine"][rel] for rel in seen)  # what was hashed, as it was hashed
