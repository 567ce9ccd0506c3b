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

from fixpack.apply import dirfd
from fixpack.apply.state import Journal, StateRecord, Unreadable
from fixpack.apply.store import Store, atomic_write, drop_bytecode, fs_error
from fixpack.errors import Drift, EnvironmentFault, Locked
from packtests.builders import deep_chain

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
    real = dirfd.read_at
    monkeypatch.setattr(dirfd, "read_at", lambda *a, **k: reads.append(a) or real(*a, **k))
    assert store.put(b"kept") == h and reads == []  # the next fix's old bytes: a stat, no read
    time.sleep(0.01)
    (store.objects / h[:2] / h[2:]).write_bytes(b"kept")  # rewritten with the same bytes: new times
    assert store.put(b"kept") == h and len(reads) == 1  # read back and found whole again


# ---- issue 41: the state folder is read as it is written, through its descriptor, after its
# owner is checked; no read blocks, follows a symlink or runs past its bound


def _special(kind: str, path: Path) -> None:
    """A name the Store may find where it expects a file: each kind the read must refuse."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink-to-fifo":
        os.mkfifo(path.with_name("planted-fifo"))
        path.symlink_to(path.with_name("planted-fifo"))
    elif kind == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse-16g":
        with open(path, "wb") as f:
            f.truncate(16 << 30)
    else:
        raise ValueError(kind)


SPECIALS = ["fifo", "folder", "symlink-to-fifo", "symlink-to-dev-zero", "sparse-16g"]


@pytest.mark.parametrize("kind", SPECIALS)
@pytest.mark.parametrize("name", ["state.json", "journal.json"])
def test_a_state_record_or_journal_that_is_no_regular_file_reads_as_unreadable_at_once(tmp_path, kind, name):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    _special(kind, store.dir / name)
    t0 = time.monotonic()
    got = store.read_state() if name == "state.json" else store.read_journal()
    assert time.monotonic() - t0 < 2
    assert isinstance(got, Unreadable) and str(store.dir / name) in got.why, got
    assert ("over the bound" if kind == "sparse-16g" else "not a regular file") in got.why
    assert store.has_journal() == (name == "journal.json")


@pytest.mark.parametrize("kind", SPECIALS)
def test_a_backup_that_is_no_regular_file_is_drift_named_and_a_later_put_replaces_it(tmp_path, kind):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    h = store.put(b"kept")
    obj = store.objects / h[:2] / h[2:]
    obj.unlink()
    _special(kind, obj)
    t0 = time.monotonic()
    with pytest.raises(
        Drift, match=f"backup {obj} is (a FIFO|a folder|a symlink|{16 << 30} bytes).*; cannot restore those exact bytes"
    ):
        store.get(h)
    assert time.monotonic() - t0 < 2 and not store.has(h)
    if kind != "folder":  # a folder in its place: the rename is refused (EISDIR), exit 6
        fresh = Store(tmp_path / ".fixpack")
        assert fresh.put(b"kept") == h and fresh.get(h) == b"kept"


def test_a_backup_folder_that_is_a_symlink_is_never_read_through(tmp_path):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    h = hashlib.sha256(b"outside").hexdigest()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / h[2:]).write_bytes(b"outside")
    (store.objects / h[:2]).symlink_to(elsewhere)
    with pytest.raises(Drift, match="not a folder"):
        store.get(h)


def test_the_state_folder_owner_is_checked_before_anything_in_it_is_read(tmp_path):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    os.mkfifo(store.state_path)  # would hang a read by path
    os.chmod(store.dir, 0o777)
    reader = Store(tmp_path / ".fixpack")
    with pytest.raises(EnvironmentFault, match="the state folder is owned by uid .* with mode 0o777; fixpack reads"):
        reader.read_state()
    if os.geteuid() == 0:
        os.chmod(store.dir, 0o755)
        os.chown(store.dir, 4321, 4321)
        with pytest.raises(EnvironmentFault, match="owned by uid 4321"):
            Store(tmp_path / ".fixpack").read_journal()


def test_a_missing_state_folder_reads_as_nothing_and_is_not_made_by_a_read(tmp_path):
    store = Store(tmp_path / "none" / ".fixpack")
    assert store.read_state() is None and store.read_journal() is None and not store.has_journal()
    assert not (tmp_path / "none").exists()


def test_the_run_lock_is_private_and_an_old_public_one_is_made_private(tmp_path):
    store = Store(tmp_path / ".fixpack")
    store.lock(timeout=1)
    store.unlock()
    assert stat.S_IMODE(os.stat(store.lock_path).st_mode) == 0o600
    os.chmod(store.lock_path, 0o644)  # made by an earlier version
    store.lock(timeout=1)
    store.unlock()
    assert stat.S_IMODE(os.stat(store.lock_path).st_mode) == 0o600


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-fifo", "folder"])
def test_a_lock_that_is_no_regular_file_is_refused_by_name_at_once(tmp_path, kind):
    store = Store(tmp_path / ".fixpack")
    store.ensure()
    _special(kind, store.lock_path)
    t0 = time.monotonic()
    with pytest.raises(EnvironmentFault, match=f"{store.lock_path}: the lock is"):
        store.lock(timeout=1)
    assert time.monotonic() - t0 < 2


def test_a_stage_is_removed_at_any_depth_and_its_removal_bound_is_named(tmp_path, monkeypatch):
    store = Store(tmp_path / ".fixpack")
    stage = store.stage("fix-a")
    deep_chain(stage, 3000)
    store.drop_stage("fix-a")
    assert not stage.exists()
    stage = store.stage("fix-a")
    for i in range(100):
        (stage / f"f{i}").touch()
    monkeypatch.setattr(dirfd, "REMOVE_BOUND", 10)
    monkeypatch.setattr(dirfd.remove_tree_at, "__kwdefaults__", {"path": None, "bound": 10})
    with pytest.raises(EnvironmentFault, match=f"{stage}: more than 10 entries"):
        store.drop_stage("fix-a")
    monkeypatch.undo()
    assert store.stage("fix-a") == stage and list(stage.iterdir()) == []  # the next stage finishes the removal
