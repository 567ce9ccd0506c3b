"""File operations the driver makes in the package folders, through folder descriptors.

The package folders may belong to someone else while fixpack runs as root (docs/security.md):
between the moment the driver looks at a path and the moment it writes there, a folder on the
way can be replaced by a symlink to anywhere, and a write by path name would follow it. So a
write, a removal or a metadata change is made relative to a descriptor of the entry's parent
folder, opened from the package folder one component at a time with ``O_NOFOLLOW`` (a symlink
is refused, never followed) and ``O_DIRECTORY`` (so is any other file type), and each folder
opened is checked to be the very one the driver saw before (same device and inode). Anything
else is `ParentReplaced`: nothing is written through it.

Reads go the same way (`read_at`, `read_under`): a file the driver reads (a target, a fix's
output, a backup, the state record) is opened relative to its folder's descriptor without
following a symlink, without blocking (a FIFO swapped in answers at once), checked to be a
regular file on the descriptor it was opened as, and read up to a bound: a symlink to a FIFO
or to ``/dev/zero``, a folder, a device node or a huge sparse file is a named refusal
(`NotRegular`), never a hang, an unbounded read or a traceback.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from fixpack.errors import EnvironmentFault

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading waits for a writer without it; O_NOCTTY: a terminal
# device opened by mistake never becomes the driver's controlling terminal
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

# The most the driver reads of one file. A target, a fix's output or a backup: the largest
# target of the pack is 0.4 MB. A state record or journal: a few kilobytes.
READ_BOUND = 64 << 20
STATE_BOUND = 16 << 20


def kind_of(mode: int) -> str:
    """What a file is, for a message: "a symlink", "a folder", "a FIFO"..."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"


class NotRegular(Exception):
    """A file the driver will not read: not a regular file (said what it is instead), or over
    its bound. Each caller turns it into its own error class (a fix's output: the fix failed; a
    target: the environment; a backup: drift)."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


class ParentReplaced(EnvironmentFault):
    """A folder on the way to ``path`` is not the one the driver saw: a symlink, another type,
    another folder, or gone."""

    def __init__(self, path: str, detail: str = "", done: str = "restored", gone: bool = False):
        super().__init__(
            f"{path}: a parent was replaced during the run; nothing was {done} through it"
            + (f" ({detail})" if detail else "")
        )
        self.path = path
        self.detail = detail
        self.gone = gone  # a folder on the way is missing (not swapped for something else)


def open_parent(root: str, path: str, expect: Callable[[str], tuple | None], done: str = "restored") -> tuple[int, str]:
    """A descriptor of ``path``'s parent folder, walked from ``root`` (which ``path`` is under),
    and ``path``'s last name. ``expect(folder path)`` gives the (device, inode) each folder must
    have, or None where there is nothing to compare with. The caller closes the descriptor."""
    rel = os.path.relpath(path, root)
    if rel.startswith("..") or rel == ".":
        raise ParentReplaced(path, f"not under {root}", done)
    parts = rel.split(os.sep)
    try:
        fd = _open_checked(None, root, root, expect)
        here = root
        try:
            for part in parts[:-1]:
                here = os.path.join(here, part)
                nxt = _open_checked(fd, part, here, expect)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
    except ParentReplaced as exc:
        raise ParentReplaced(path, exc.detail, done, exc.gone) from None  # named by the entry it was for
    return fd, parts[-1]


def open_dir(path: str, expect: Callable[[str], tuple | None]) -> int:
    """A descriptor of the folder ``path`` itself (a package folder), not through a symlink,
    checked as `open_parent` checks each folder."""
    return _open_checked(None, path, path, expect)


def _open_checked(dir_fd: int | None, name: str, path: str, expect: Callable[[str], tuple | None]) -> int:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ParentReplaced(
                path,
                f"{path} is no longer a folder: {'a symlink' if exc.errno == errno.ELOOP or _is_link(dir_fd, name) else 'another file type'}",
            ) from None
        if exc.errno == errno.ENOENT:
            raise ParentReplaced(path, f"{path} is gone", gone=True) from None
        raise
    want = expect(path)
    st = os.fstat(fd)
    if want is not None and (st.st_dev, st.st_ino) != tuple(want):
        os.close(fd)
        raise ParentReplaced(path, f"{path} is another folder than the one seen before the fix ran")
    return fd


def _is_link(dir_fd: int | None, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


# The most entries one removal takes away. A tree at any depth is removed (`remove_tree_at`
# keeps it one level deep as it goes); a tree that keeps growing while it is removed ends it.
REMOVE_BOUND = 2_000_000


class BoundExceeded(EnvironmentFault):
    """A tree the driver walks or removes is larger or deeper than its bound: a tree shaped to
    exhaust the driver's stack, descriptors, memory or time. Refused by name (exit 6 unless the
    caller says whose fault it is)."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


def remove_tree_at(dir_fd: int, name: str, *, path: str | None = None, bound: int = REMOVE_BOUND) -> int:
    """Remove ``name`` in ``dir_fd`` and, if it is a real folder, everything in it, never
    following a symlink (one is removed as an entry). Returns how many entries went.

    Iterative at any depth, with two folders open at most: the folder's subfolders' own
    subfolders are moved up into it (a rename within the tree being removed) before each
    subfolder is emptied and removed, so that the tree is never more than two levels deep where
    the removal works, however deep it was made (a 3,000-deep chain included). Past ``bound``
    entries it stops with `BoundExceeded` naming ``path``; what is left is removed by the next
    removal of the same name."""
    shown = path or name
    try:
        top = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            os.unlink(name, dir_fd=dir_fd)
            return 1
        raise
    removed = 0  # entries removed
    steps = 0  # entries removed or moved up: what the bound counts
    serial = 0
    try:
        _ensure_owner_rwx(top)
        while True:
            emptied = 0
            with os.scandir(top) as entries:
                for entry in entries:
                    emptied += 1
                    steps += 1
                    if steps > bound:
                        raise BoundExceeded(
                            shown, f"more than {bound} entries; the removal stopped there (the next one goes on)"
                        )
                    if not entry.is_dir(follow_symlinks=False):
                        _unlink_quiet(entry.name, top)
                        removed += 1
                        continue
                    try:
                        sub = os.open(entry.name, _DIR_FLAGS, dir_fd=top)
                    except OSError as exc:
                        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped since it was listed
                            _unlink_quiet(entry.name, top)
                            removed += 1
                            continue
                        if exc.errno == errno.ENOENT:
                            continue
                        raise
                    try:
                        _ensure_owner_rwx(sub)
                        with os.scandir(sub) as kids:
                            for kid in kids:
                                steps += 1
                                if steps > bound:
                                    raise BoundExceeded(
                                        shown,
                                        f"more than {bound} entries; the removal stopped there (the next one goes on)",
                                    )
                                if kid.is_dir(follow_symlinks=False):
                                    serial = _move_up(sub, kid.name, top, serial)  # removed when its turn comes
                                else:
                                    _unlink_quiet(kid.name, sub)
                                    removed += 1
                    finally:
                        os.close(sub)
                    try:
                        os.rmdir(entry.name, dir_fd=top)
                        removed += 1
                    except OSError as exc:
                        if exc.errno != errno.ENOTEMPTY:  # filled again meanwhile: the next pass takes it
                            raise
            if not emptied:
                break
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=dir_fd)
    return removed + 1


def _move_up(src_fd: int, name: str, dst_fd: int, serial: int) -> int:
    """Move the folder ``name`` of ``src_fd`` into ``dst_fd`` under a fresh name; the serial used."""
    while True:
        serial += 1
        try:
            os.rename(name, f".fixpack-rm.{serial}", src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            return serial
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                continue  # that name is taken: the next one
            if exc.errno in (errno.EACCES, errno.EPERM):
                # a folder without its owner's write bit cannot be moved (its ".." changes)
                fd = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
                try:
                    _ensure_owner_rwx(fd)
                finally:
                    os.close(fd)
                os.rename(name, f".fixpack-rm.{serial}", src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                return serial
            raise


def _ensure_owner_rwx(fd: int) -> None:
    """A folder made without its owner's bits (by a fix, in its own stage) is given them back,
    so that its entries can be removed; one of another owner is left as it is."""
    st = os.fstat(fd)
    if st.st_mode & 0o700 != 0o700 and st.st_uid == os.geteuid():
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)


def _unlink_quiet(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def create_at(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """A new file ``name`` in ``dir_fd`` holding ``data`` (``O_EXCL | O_NOFOLLOW``: nothing
    that is already there is written through)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write_at(dir_fd: int, name: str, data: bytes, *, uid: int, gid: int, mode: int, mtime_ns: int) -> None:
    """Put ``data`` in place of ``name`` in ``dir_fd`` (a new file renamed over it), with the
    owner, mode and times given, all on descriptors."""
    tmp = f".{name}.fixpack-restore"
    try:
        os.unlink(tmp, dir_fd=dir_fd)  # left by a killed run, or planted: never written through
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            set_metadata(fd, uid=uid, gid=gid, mode=mode, mtime_ns=mtime_ns)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)


def set_metadata(fd: int, *, uid: int, gid: int, mode: int, mtime_ns: int | None) -> None:
    """Owner, then mode (chown clears setuid and setgid), then times, on a descriptor."""
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
    os.fchmod(fd, mode & 0o7777)
    if mtime_ns is not None:
        os.utime(fd, ns=(mtime_ns, mtime_ns))


def read_at(dir_fd: int | None, name: str, *, limit: int, path: str | None = None) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd``, at most ``limit`` of them.

    The name is opened with ``O_PATH | O_NOFOLLOW`` (nothing is opened for reading yet: not a
    FIFO, not a device) and checked on that descriptor; only a regular file is then opened for
    reading, through ``/proc/self/fd`` (the very inode checked, whatever is at the name by then)
    and non-blocking. Without ``/proc``, the name itself is opened ``O_NOFOLLOW | O_NONBLOCK``
    and checked again on the descriptor. The size is checked before the read and the read stops
    one byte past the bound (a file growing meanwhile). A missing file raises FileNotFoundError;
    anything else refused raises `NotRegular` naming ``path`` (default ``name``)."""
    shown = path or name
    pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        _regular(os.fstat(pfd), shown, limit)
        try:
            fd = os.open(f"/proc/self/fd/{pfd}", _READ_FLAGS)
        except FileNotFoundError:  # no /proc: the name again, never through a symlink
            try:
                fd = os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise NotRegular(shown, "a symlink (swapped in while it was opened), not a regular file") from None
                raise
    finally:
        os.close(pfd)
    try:
        st = os.fstat(fd)
        _regular(st, shown, limit)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, max(st.st_size + 1, 1 << 16)))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise NotRegular(shown, f"larger than the bound of {limit} bytes (it grew while it was read); not read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _regular(st: os.stat_result, shown: str, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(shown, f"{kind_of(st.st_mode)}, not a regular file; not read")
    if st.st_size > limit:
        raise NotRegular(shown, f"{st.st_size} bytes, over the bound of {limit} bytes; not read")


def read_under(root: str, path: str, *, limit: int = READ_BOUND) -> bytes:
    """The bytes of ``path``, a file under the package folder ``root``, read through its
    folder's descriptor walked from ``root`` (`open_parent`: a symlink on the way is refused,
    `ParentReplaced`) with `read_at`. A folder missing on the way is a missing file
    (FileNotFoundError), as it is for a read by path."""
    try:
        pfd, name = open_parent(root, path, lambda _: None, done="read")
    except ParentReplaced as exc:
        if exc.gone:
            raise FileNotFoundError(errno.ENOENT, f"{exc.detail}", path) from None
        raise
    try:
        return read_at(pfd, name, limit=limit, path=path)
    finally:
        os.close(pfd)


def read_path(path: str, *, limit: int) -> bytes:
    """`read_at` of ``path`` through a descriptor of its folder (opened by its path: for files
    outside the package folders, such as an installed package's metadata)."""
    parent, name = os.path.split(path)
    dfd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return read_at(dfd, name, limit=limit, path=path)
    finally:
        os.close(dfd)
