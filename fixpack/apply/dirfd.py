"""File operations the driver makes in the package folders, through folder descriptors.

The package folders may belong to someone else while fixpack runs as root (docs/security.md):
between the moment the driver looks at a path and the moment it writes there, a folder on the
way can be replaced by a symlink to anywhere, and a write by path name would follow it. So a
write, a removal or a metadata change is made relative to a descriptor of the entry's parent
folder, opened from the package folder one component at a time with ``O_NOFOLLOW`` (a symlink
is refused, never followed) and ``O_DIRECTORY`` (so is any other file type), and each folder
opened is checked to be the very one the driver saw before (same device and inode). Anything
else is `ParentReplaced`: nothing is written through it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from fixpack.errors import EnvironmentFault

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ParentReplaced(EnvironmentFault):
    """A folder on the way to ``path`` is not the one the driver saw: a symlink, another type,
    another folder, or gone."""

    def __init__(self, path: str, detail: str = "", done: str = "restored"):
        super().__init__(
            f"{path}: a parent was replaced during the run; nothing was {done} through it"
            + (f" ({detail})" if detail else "")
        )
        self.path = path
        self.detail = detail


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
        raise ParentReplaced(path, exc.detail, done) from None  # named by the entry it was for
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
            raise ParentReplaced(path, f"{path} is gone") from None
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


def remove_tree_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` in ``dir_fd`` and, if it is a real folder, everything in it, never
    following a symlink (one is removed as an entry)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            os.unlink(name, dir_fd=dir_fd)
            return
        raise
    try:
        for child in os.listdir(fd):
            remove_tree_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


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
