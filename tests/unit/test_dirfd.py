"""fixpack.apply.dirfd: what the driver reads, and the trees it removes.

Reads (issue 41, item 3): a file is read only as a regular file, through its folder's
descriptor, never through a symlink, never blocking, and up to a bound; anything else is a
named refusal (`NotRegular`), never a hang, an unbounded read or a traceback. The rule is tested
on every kind of file a name can hold, not only the FIFO that was found first.

Removal (item 4): a tree at any depth, of any width, holding symlinks to anywhere, is removed
iteratively with two descriptors open at most, without following a symlink; past its bound the
removal stops by name and the next one goes on.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys
import time
from pathlib import Path

import pytest

from fixpack.apply import dirfd
from fixpack.apply.dirfd import BoundExceeded, NotRegular, ParentReplaced, read_at, read_under, remove_tree_at
from packtests.builders import deep_chain

# ---- reads


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


def _symlink(target: str):
    def make(path: Path) -> Path:
        path.symlink_to(target)
        return path

    return make


def _chardev(path: Path) -> Path:
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("no CAP_MKNOD here")
    return path


# every kind of name the driver may meet where it expects a file, and the word that names it
KINDS = {
    "fifo": (_fifo, "a FIFO"),
    "socket": (_socket, "a socket"),
    "folder": (lambda p: (p.mkdir(), p)[1], "a folder"),
    "char-device": (_chardev, "a character device"),
    "symlink-to-fifo": (None, "a symlink"),  # made below: it needs a FIFO beside it
    "symlink-to-dev-zero": (_symlink("/dev/zero"), "a symlink"),
    "symlink-to-a-regular-file": (_symlink("/etc/hostname"), "a symlink"),
    "dangling-symlink": (_symlink("/nonexistent/x"), "a symlink"),
}


def _make(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / "name"
    if kind == "symlink-to-fifo":
        return _symlink(str(_fifo(tmp_path / "fifo")))(path)
    return KINDS[kind][0](path)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_read_at_refuses_every_kind_of_file_but_a_regular_one_by_name_at_once(tmp_path, kind):
    _make(kind, tmp_path)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    t0 = time.monotonic()
    try:
        with pytest.raises(NotRegular) as got:
            read_at(dfd, "name", limit=1 << 20, path="shown/name")
    finally:
        os.close(dfd)
    assert time.monotonic() - t0 < 2  # never waits for a writer, never reads a device
    assert got.value.path == "shown/name" and got.value.what.startswith(KINDS[kind][1]), got.value
    assert "not a regular file" in str(got.value)


def test_read_at_reads_a_regular_file_whole_and_refuses_one_over_its_bound_without_reading_it(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 1000)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_at(dfd, "f", limit=1000) == b"x" * 1000
        with pytest.raises(NotRegular, match="1000 bytes, over the bound of 999 bytes"):
            read_at(dfd, "f", limit=999)
        # a 16 GiB sparse file: refused by its size, in no time
        with open(tmp_path / "huge", "wb") as f:
            f.truncate(16 << 30)
        t0 = time.monotonic()
        with pytest.raises(NotRegular, match=f"{16 << 30} bytes, over the bound"):
            read_at(dfd, "huge", limit=dirfd.STATE_BOUND)
        assert time.monotonic() - t0 < 1
        with pytest.raises(FileNotFoundError):
            read_at(dfd, "missing", limit=10)
    finally:
        os.close(dfd)


def _swap_after_the_first_open(monkeypatch, tmp_path: Path, *, proc: bool) -> None:
    """A FIFO renamed over the name right after the driver's first look at it (the O_PATH open,
    where an lstat used to be); without ``proc``, /proc/self/fd is not there to reopen from."""
    real = os.open
    state = {"swapped": False}

    def open_(path, flags, *args, **kw):
        if isinstance(path, str) and path.startswith("/proc/self/fd/") and not proc:
            raise FileNotFoundError(errno.ENOENT, "no /proc", path)
        fd = real(path, flags, *args, **kw)
        if flags & os.O_PATH and not state["swapped"]:
            state["swapped"] = True
            _fifo(tmp_path / "fifo")
            os.rename(tmp_path / "fifo", tmp_path / "f")
        return fd

    monkeypatch.setattr(os, "open", open_)


def test_a_fifo_swapped_in_after_the_check_is_never_opened_the_inode_checked_is_read(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"the bytes checked")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _swap_after_the_first_open(monkeypatch, tmp_path, proc=True)
        assert read_at(dfd, "f", limit=100) == b"the bytes checked"  # reopened from the descriptor, not the name
    finally:
        monkeypatch.undo()
        os.close(dfd)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "f").st_mode)  # the swap did happen


def test_without_proc_a_fifo_swapped_in_is_opened_without_blocking_and_refused(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"the bytes checked")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _swap_after_the_first_open(monkeypatch, tmp_path, proc=False)
        t0 = time.monotonic()
        with pytest.raises(NotRegular, match="a FIFO, not a regular file"):
            read_at(dfd, "f", limit=100)
        assert time.monotonic() - t0 < 2
    finally:
        monkeypatch.undo()
        os.close(dfd)


def test_read_under_walks_from_the_package_folder_and_follows_no_symlink_on_the_way(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "m.py").write_bytes(b"inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "m.py").write_bytes(b"outside\n")
    (pkg / "link").symlink_to(outside)
    assert read_under(str(pkg), str(pkg / "sub" / "m.py")) == b"inside\n"
    with pytest.raises(ParentReplaced, match="nothing was read through it"):
        read_under(str(pkg), str(pkg / "link" / "m.py"))
    with pytest.raises(ParentReplaced, match="not under"):
        read_under(str(pkg), str(pkg / ".." / "outside" / "m.py"))
    with pytest.raises(FileNotFoundError):  # a folder missing on the way: the file is missing
        read_under(str(pkg), str(pkg / "nowhere" / "deeper" / "m.py"))


# ---- removal


def _remove(parent: Path, name: str, **kw) -> int:
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return remove_tree_at(fd, name, **kw)
    finally:
        os.close(fd)


def test_a_3000_deep_chain_is_removed_without_recursion_and_with_a_constant_number_of_descriptors(
    tmp_path, monkeypatch
):
    (tmp_path / "stage").mkdir()
    deep_chain(tmp_path / "stage", 3000)
    open_fds = len(os.listdir("/proc/self/fd"))
    peak = {"n": 0}
    real_open = os.open

    def counting_open(*a, **kw):
        fd = real_open(*a, **kw)
        peak["n"] = max(peak["n"], len(os.listdir("/proc/self/fd")) - open_fds)
        return fd

    monkeypatch.setattr(os, "open", counting_open)
    assert sys.getrecursionlimit() < 3000  # a recursive removal would stop at a third of the way
    assert _remove(tmp_path, "stage") == 3000 + 2  # 3,000 folders, the file, the stage itself
    assert not (tmp_path / "stage").exists()
    # a constant, whatever the depth: the folder being emptied and its subfolder, each with its
    # listing's own duplicate, and the count's own listing of /proc/self/fd
    assert peak["n"] <= 5


@pytest.mark.parametrize(
    "shape",
    ["wide", "deep-and-wide", "symlink-chain", "symlinks-out", "closed-modes", "fifo-and-socket"],
)
def test_every_shape_of_tree_is_removed_and_nothing_outside_it_is_touched(tmp_path, shape):
    stage = tmp_path / "stage"
    stage.mkdir()
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("keep")
    if shape == "wide":
        for i in range(20_000):
            (stage / f"f{i}").touch()
    elif shape == "deep-and-wide":
        for i in range(30):
            (stage / f"b{i}").mkdir()
            deep_chain(stage / f"b{i}", 200)
    elif shape == "symlink-chain":
        # 60 symlinks each to the next (a loop at the end): opened as a folder, each is ELOOP
        for i in range(60):
            (stage / f"l{i}").symlink_to(stage / f"l{(i + 1) % 60}")
    elif shape == "symlinks-out":
        (stage / "to-outside").symlink_to(outside)
        (stage / "sub").mkdir()
        (stage / "sub" / "to-keep").symlink_to(outside / "keep")
        (stage / "sub" / "to-file").symlink_to(outside / "keep" / "file")
    elif shape == "closed-modes":
        deep_chain(stage, 20)
        for d, _, _ in os.walk(stage):
            os.chmod(d, 0)
    elif shape == "fifo-and-socket":
        _fifo(stage / "fifo")
        _socket(stage / "sock")
    _remove(tmp_path, "stage")
    assert not stage.exists()
    assert (outside / "keep" / "file").read_text() == "keep"


def test_past_its_bound_the_removal_stops_by_name_and_the_next_one_finishes(tmp_path):
    (tmp_path / "stage").mkdir()
    deep_chain(tmp_path / "stage", 50)
    for i in range(50):
        (tmp_path / "stage" / f"f{i}").touch()
    with pytest.raises(BoundExceeded, match=r"shown/stage: more than 30 entries; the removal stopped there") as got:
        _remove(tmp_path, "stage", path="shown/stage", bound=30)
    assert got.value.exit_code == 6
    assert (tmp_path / "stage").exists()
    _remove(tmp_path, "stage")
    assert not (tmp_path / "stage").exists()


def test_a_symlink_or_file_at_the_name_is_removed_as_an_entry(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "x").touch()
    (tmp_path / "link").symlink_to(target)
    assert _remove(tmp_path, "link") == 1
    assert (target / "x").exists() and not (tmp_path / "link").exists()
