"""fixpack.apply.store in process: content-addressed backups, atomic writes, the state record and
journal checks, the run lock."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time
from pathlib import Path

import pytest

from fixpack.apply.state import Journal, StateRecord, Unreadable
from fixpack.apply.store import Store, atomic_write, drop_bytecode, fs_error
from fixpack.errors import Drift, Locked

H = "ab" * 32  # a well-formed sha256


def test_put_stores_bytes_under_their_hash_once_and_get_gives_them_back(tmp_path):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    h = store.put(b"pristine bytes")
    assert h == hashlib.sha256(b"pristine bytes").hexdigest()
    assert (tmp_path / ".fixpack" / "objects" / h[:2] / h[2:]).read_bytes() == b"pristine bytes"
    assert store.put(b"pristine bytes") == h and store.has(h)
    assert store.get(h) == b"pristine bytes"


def test_get_refuses_a_missing_or_corrupt_backup(tmp_path):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    with pytest.raises(Drift, match=f"backup {H[:12]} is missing"):
        store.get(H)
    h = store.put(b"kept")
    (store.objects / h[:2] / h[2:]).write_bytes(b"changed")
    with pytest.raises(Drift, match="is corrupt"):
        store.get(h)
    assert store.put(b"kept") == h and store.get(h) == b"kept"  # a later put repairs it


def test_atomic_write_replaces_the_file_keeps_its_mode_and_leaves_no_staging_file(tmp_path):
    path = tmp_path / "mod.py"
    path.write_bytes(b"old")
    os.chmod(path, 0o751)
    atomic_write(path, b"new", like=os.stat(path))
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o751
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mod.py"]


def test_atomic_write_never_writes_through_a_planted_staging_symlink(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not yours")
    path = tmp_path / "mod.py"
    path.write_bytes(b"old")
    (tmp_path / ".mod.py.fixpack-tmp").symlink_to(outside)
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new" and not path.is_symlink()
    assert outside.read_bytes() == b"not yours"


def test_atomic_write_reports_the_path_and_the_reason(tmp_path):
    with pytest.raises(Exception) as exc:
        atomic_write(tmp_path / "no-such-dir" / "f", b"x")
    assert f"cannot write {tmp_path / 'no-such-dir' / 'f'}" in str(exc.value)


def test_state_record_round_trips_and_a_bad_one_reads_as_corrupt(tmp_path):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    assert store.read_state() is None
    steps = [{"fix": "a", "files": {"pkg/m.py": [H, "cd" * 32]}}]
    store.write_state(StateRecord.from_json({"key": "-|", "steps": steps}))
    state = store.read_state()
    assert isinstance(state, StateRecord)
    assert [(s.fix, s.files) for s in state.steps] == [(s["fix"], s["files"]) for s in steps]
    assert state.key == "-|" and state.format == 1 and state.updated.endswith("Z")
    for bad in (
        b"{not json",
        b"[1, 2]",
        json.dumps({"steps": [{"fix": "a", "files": {"pkg/m.py": ["short", H]}}]}).encode(),
    ):
        store.state_path.write_bytes(bad)
        assert isinstance(store.read_state(), Unreadable)


def test_journal_is_read_only_when_complete(tmp_path):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    journal = {
        "op": "apply",
        "step": {"fix": "a", "files": {"pkg/m.py": [H, H]}},
        "files": {"pkg/m.py": [H, H]},
        "state_base": {},
        "steps_before": [],
    }
    store.write_journal(Journal.from_json(journal))
    got = store.read_journal()
    assert isinstance(got, Journal)
    assert (got.op, got.step.fix, got.step.files, got.files, got.state_base.to_json(steps=False), got.steps_before) == (
        "apply",
        "a",
        journal["step"]["files"],
        journal["files"],
        {},
        [],
    )
    store.write_journal(Journal.from_json(dict(journal, op="delete")))
    assert isinstance(store.read_journal(), Unreadable)
    store.clear_journal()
    assert store.read_journal() is None
    store.clear_journal()  # already gone: nothing to do


def test_a_second_holder_of_the_run_lock_waits_then_gives_up(tmp_path):
    first, second = Store(tmp_path / ".fixpack"), Store(tmp_path / ".fixpack")
    first.lock(timeout=1)
    try:
        with pytest.raises(Locked, match="another fixpack run holds"):
            second.lock(timeout=0.1)
    finally:
        first.unlock()
    second.lock(timeout=0.1)  # free again
    second.unlock()


def test_drop_bytecode_removes_only_that_module_s_pyc(tmp_path):
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in ("mod.cpython-311.pyc", "mod.cpython-312.opt-1.pyc", "model.cpython-311.pyc"):
        (cache / name).write_bytes(b"")
    drop_bytecode(tmp_path / "mod.py")
    assert sorted(p.name for p in cache.iterdir()) == ["model.cpython-311.pyc"]


def test_fs_error_says_what_and_why():
    exc = fs_error(OSError(errno.ENOSPC, "x"), "cannot write /t/f")
    assert str(exc) == "cannot write /t/f: no space left on device"


def test_an_object_this_store_wrote_is_not_read_back_until_it_changes(tmp_path, monkeypatch):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    h = store.put(b"kept")
    reads = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or real(self))
    assert store.put(b"kept") == h and reads == []  # the next fix's old bytes: a stat, no read
    time.sleep(0.01)
    (store.objects / h[:2] / h[2:]).write_bytes(b"kept")  # rewritten with the same bytes: new times
    assert store.put(b"kept") == h and len(reads) == 1  # read back and found whole again
