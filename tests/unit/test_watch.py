"""fixpack.sandbox.watch: the snapshot the driver compares each fix's process with.

`driver_wrote` updates the snapshot for the driver's own commits from an index of the folders
(not a pass over every entry); after any number of commits it must hold exactly what a fresh
scan finds, and still show a change made elsewhere.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fixpack.apply.dirfd import BoundExceeded
from fixpack.apply.store import atomic_write
from fixpack.sandbox.watch import WALK_DEPTH, TreeWatch, scan
from packtests.builders import deep_chain, remove_tree


def tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    pkg = tmp_path / "pkg"
    for sub in ("a", "a/deep", "b"):
        (pkg / sub).mkdir(parents=True)
    for rel in ("a/x.py", "a/y.py", "a/deep/z.py", "b/w.py"):
        (pkg / rel).write_text(f"# {rel}\n")
    (pkg / "a" / "__pycache__").mkdir()
    (pkg / "a" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"pyc")
    state = tmp_path / "state"
    (state / "objects" / "ab").mkdir(parents=True)
    (state / "objects" / "ab" / "cd").write_bytes(b"object")
    (state / "staging").mkdir()
    return pkg, state, state / "staging"


def commit(pkg: Path, state: Path, rel: str, n: int) -> Path:
    """What the journal does to a target and the state folder."""
    target = pkg / rel
    atomic_write(target, f"# {rel} v{n}\n".encode())
    for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        pyc.unlink()
    (state / "objects" / f"{n:02x}").mkdir(exist_ok=True)
    (state / "objects" / f"{n:02x}" / "ef").write_bytes(b"new object")
    atomic_write(state / "state.json", f'{{"n": {n}}}'.encode())
    return target


def test_after_the_driver_commits_the_snapshot_is_what_a_fresh_scan_finds(tmp_path):
    pkg, state, staging = tree(tmp_path)
    watch = TreeWatch([pkg, state], skip={str(staging)}, keep_bytes=False)
    watch.take()
    for n, rel in enumerate(["a/x.py", "a/deep/z.py", "a/x.py", "b/w.py", "a/y.py"], start=1):
        written = commit(pkg, state, rel, n)
        (staging / f"{n}.out").write_text("a fix's stage is not watched")
        watch.driver_wrote([written], state)
        assert watch.before == scan([pkg, state], {str(staging)}), rel
        assert watch.changes() == []


def test_a_change_beside_the_driver_s_commit_is_still_found(tmp_path):
    pkg, state, staging = tree(tmp_path)
    watch = TreeWatch([pkg, state], skip={str(staging)}, keep_bytes=False)
    watch.take()
    written = commit(pkg, state, "a/x.py", 1)
    watch.driver_wrote([written], state)
    (pkg / "b" / "w.py").write_text("changed by someone else\n")  # a folder the commit did not touch
    os.chmod(pkg / "a" / "deep" / "z.py", 0o600)
    (pkg / "b" / "new.py").write_text("")
    found = {(Path(c.path).relative_to(pkg).as_posix(), c.what) for c in watch.changes()}
    assert found == {("b/w.py", "changed"), ("a/deep/z.py", "changed"), ("b/new.py", "created"), ("b", "changed")}


def test_a_new_snapshot_gets_a_new_index(tmp_path):
    pkg, state, staging = tree(tmp_path)
    watch = TreeWatch([pkg, state], skip={str(staging)}, keep_bytes=False)
    watch.take()
    watch.driver_wrote([commit(pkg, state, "a/x.py", 1)], state)
    (pkg / "b" / "v.py").write_text("")  # seen by the next snapshot, then removed by a commit's folder rescan
    watch.take()
    (pkg / "b" / "v.py").unlink()
    watch.driver_wrote([commit(pkg, state, "b/w.py", 2)], state)
    assert watch.before == scan([pkg, state], {str(staging)})


# ---- issue 41, item 4: the scan of trees the package folders' owner (or an unsealed fix) can
# shape is iterative and bounded; a bound exceeded is named, never a RecursionError


@pytest.mark.parametrize("depth", [WALK_DEPTH + 1, 3000])
def test_a_snapshot_of_a_tree_deeper_than_the_walk_goes_is_refused_by_name(tmp_path, depth):
    pkg, state, staging = tree(tmp_path)
    chain = deep_chain(pkg / "a", depth)
    try:
        watch = TreeWatch([pkg, state], skip={str(staging)}, keep_bytes=True)
        with pytest.raises(BoundExceeded, match=f"folders nested deeper than {WALK_DEPTH} levels below {pkg}") as got:
            watch.take()
        assert got.value.exit_code == 6 and str(pkg / "a" / "d") in str(got.value)
    finally:
        remove_tree(chain)


def test_a_tree_just_within_the_depth_bound_is_scanned_whole(tmp_path):
    pkg, state, staging = tree(tmp_path)
    deep_chain(pkg, WALK_DEPTH - 1)
    found = scan([pkg], set())
    assert str(pkg / ("d/" * (WALK_DEPTH - 1)).rstrip("/")) in found


def test_a_snapshot_of_more_entries_than_the_bound_is_refused_by_name(tmp_path, monkeypatch):
    import fixpack.sandbox.watch as W

    pkg, state, staging = tree(tmp_path)
    for i in range(30):
        (pkg / "b" / f"f{i}.py").touch()
    monkeypatch.setattr(W, "WALK_ENTRIES", 25)
    with pytest.raises(BoundExceeded, match=f"{pkg}: more than 25 entries under it"):
        TreeWatch([pkg, state], skip={str(staging)}, keep_bytes=False).take()


@pytest.mark.parametrize("keep_bytes", [True, False])
def test_a_deep_chain_made_during_a_fix_is_found_and_removed_whole(tmp_path, keep_bytes):
    pkg, state, staging = tree(tmp_path)
    watch = TreeWatch([pkg, state], skip={str(staging)}, keep_bytes=keep_bytes)
    watch.take()
    (pkg / "a" / "planted").mkdir()
    deep_chain(pkg / "a" / "planted", 3000)
    changed = watch.changes()
    assert ("created", str(pkg / "a" / "planted")) in {(c.what, c.path) for c in changed}
    watch.restore(changed)
    assert not (pkg / "a" / "planted").exists()
    watch.take()  # within its bounds again
    assert watch.changes() == []


def test_a_chain_grown_below_the_deepest_folder_walked_is_found_as_created_and_removed_whole(tmp_path):
    pkg, state, staging = tree(tmp_path)
    deep_chain(pkg, WALK_DEPTH - 1)
    watch = TreeWatch([pkg], skip=set(), keep_bytes=False)
    watch.take()
    bottom = pkg / ("d/" * (WALK_DEPTH - 1)).rstrip("/")
    deep_chain(bottom, 500)
    changed = watch.changes()
    assert ("created", str(bottom / "d")) in {(c.what, c.path) for c in changed}
    assert not [c for c in changed if c.fields == "depth"]  # under a created entry: removed with it
    watch.restore(changed)
    assert not (bottom / "d").exists()
    assert [c.how for c in changed if c.what == "created"] == ["removed"]


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-zero"])
def test_a_kept_file_swapped_for_a_fifo_or_a_device_is_a_change_and_no_read_hangs(tmp_path, kind):
    pkg, state, staging = tree(tmp_path)
    watch = TreeWatch([pkg, state], skip={str(staging)}, keep_bytes=True)
    watch.take()
    target = pkg / "a" / "x.py"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    changed = watch.changes()
    assert ("changed", str(target)) in {(c.what, c.path) for c in changed}
    watch.restore(changed)
    assert stat.S_ISREG(os.lstat(target).st_mode)  # replaced as an entry, never opened
    assert target.read_text() == "# a/x.py\n"  # put back from the bytes kept before


def test_a_name_with_terminal_escapes_is_printed_escaped(tmp_path):
    pkg, state, staging = tree(tmp_path)
    watch = TreeWatch([pkg], skip=set(), keep_bytes=True)
    watch.take()
    (pkg / "b" / "\x1b[2Jfix-x....applied\n").write_text("")
    (c,) = [c for c in watch.changes() if c.what == "created"]
    line = c.line()
    assert "\x1b" not in line and "\n" not in line and "\\x1b[2Jfix-x....applied\\x0a" in line
