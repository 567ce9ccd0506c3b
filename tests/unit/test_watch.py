"""fixpack.sandbox.watch: the snapshot the driver compares each fix's process with.

`driver_wrote` updates the snapshot for the driver's own commits from an index of the folders
(not a pass over every entry); after any number of commits it must hold exactly what a fresh
scan finds, and still show a change made elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from fixpack.apply.store import atomic_write
from fixpack.sandbox.watch import TreeWatch, scan


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
