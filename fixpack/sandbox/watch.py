"""What a fix's process changed, whatever confined it: a snapshot of the trees before, and after.

The driver records (device, inode, size, mtime_ns, ctime_ns, mode) of every entry under the
package folders it works on and under its state folder (the fixes' staging folders aside)
before a fix's process starts, and compares after it ends. A write through any name (a hard
link, a ``dir_fd``, ``/proc/self/fd``, ctypes) changes the inode's ctime; a rename or a new
file changes the entries. The cost is one ``lstat`` per entry: about 5,000 for vLLM.

Where the kernel does not confine the fix (no Landlock), the driver also keeps the bytes of
every file up to ``KEEP_BYTES_UP_TO`` from before the first fix, so that it can put back
whatever a fix changed. Under Landlock a fix cannot change a file's bytes outside its stage;
what is left (mode, times: Landlock does not govern metadata) is restored from the snapshot.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from fixpack.apply import dirfd
from fixpack.apply.dirfd import ParentReplaced
from fixpack.apply.store import stat_entry

KEEP_BYTES_UP_TO = 8 << 20  # every .py file; a large binary is named for reinstalling instead

Entry = tuple  # (dev, ino, size, mtime_ns, ctime_ns, mode, uid, gid)


def scan(roots: list[Path], skip: set[str]) -> dict[str, Entry]:
    out: dict[str, Entry] = {}

    def walk(d: str) -> None:
        try:
            it = os.scandir(d)
        except OSError:
            return
        with it:
            for e in it:
                if e.path in skip:
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[e.path] = stat_entry(st)
                if stat.S_ISDIR(st.st_mode):
                    walk(e.path)

    for r in roots:
        try:
            out[str(r)] = stat_entry(os.lstat(r))
        except OSError:
            continue
        walk(str(r))
    return out


def _read_entry(path: str, e: Entry) -> bytes | None:
    """The bytes of the file the snapshot saw at ``path``: not through a symlink put there since,
    and only if it is the same inode (a folder on the way swapped for a symlink would otherwise
    have the driver keep, and later put back here, the bytes of a file outside the tree)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != e[:2]:
            return None
        return f.read()


@dataclass
class Change:
    path: str
    what: str  # changed | created | removed
    restored: bool = False
    how: str = ""
    fields: str = ""  # what differs: inode, size, mtime, mode, owner
    # a folder on its way (or the folder itself) is not the one seen before: nothing was done through it
    replaced: bool = False

    def line(self) -> str:
        if self.replaced:
            return f"{self.path}: {self.how}"
        fields = f" ({self.fields})" if self.fields else ""
        return f"{self.path}: {self.what}{fields}; {'restored' if self.restored else 'NOT restored'} ({self.how})"


_FIELDS = ("device", "inode", "size", "mtime", "ctime", "mode", "uid", "gid")


def _differs(old: Entry, new: Entry) -> str:
    out = []
    for name, a, b in zip(_FIELDS, old, new, strict=True):
        if a != b and name != "ctime":
            out.append(f"{name} {oct(stat.S_IMODE(a))}->{oct(stat.S_IMODE(b))}" if name == "mode" else name)
    return ", ".join(out) or "ctime, and the bytes differ from the copy"


@dataclass
class TreeWatch:
    roots: list[Path]
    skip: set[str]
    keep_bytes: bool
    before: dict[str, Entry] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)
    digest: dict[str, str] = field(default_factory=dict)  # files too large to keep: their sha256
    # `_by_folder`'s index of ``before``, and the dict it was made for (a new snapshot: made again)
    _kids: dict[str, set[str]] = field(default_factory=dict, repr=False)
    _kids_of: dict | None = field(default=None, repr=False)
    _made: dict[str, tuple] = field(default_factory=dict, repr=False)  # folders a restore made again: (device, inode)

    def take(self) -> None:
        """The snapshot a fix's process is compared with."""
        old = self.before
        self.before = scan(self.roots, self.skip)
        if not self.keep_bytes:
            return
        for path, e in self.before.items():
            if stat.S_ISREG(e[5]) and (path not in self.data and path not in self.digest or old.get(path) != e):
                data = _read_entry(path, e)
                if data is None:
                    continue
                if e[2] <= KEEP_BYTES_UP_TO:
                    self.data[path] = data
                else:
                    self.digest[path] = hashlib.sha256(data).hexdigest()
        for path in (set(self.data) | set(self.digest)) - set(self.before):
            self.data.pop(path, None)
            self.digest.pop(path, None)

    def start_keeping_bytes(self) -> None:
        if not self.keep_bytes:
            self.keep_bytes = True
            self.before = {}
            self.take()

    def _same_bytes(self, path: str, old: Entry, new: Entry) -> bool:
        """Only the ctime moved: a link to the inode was made or removed somewhere (a scratch
        tree hard-linked from a cache, say), or the bytes were written and the mtime set back.
        Under Landlock the bytes cannot have changed; else the kept bytes or digest decide."""
        if old[:4] != new[:4] or old[5:] != new[5:]:
            return False
        if not stat.S_ISREG(old[5]) or not self.keep_bytes:
            return True
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return False
        if path in self.data:
            return data == self.data[path]
        return path in self.digest and hashlib.sha256(data).hexdigest() == self.digest[path]

    def changes(self) -> list[Change]:
        """What differs from the snapshot; the scan made for it is the next fix's snapshot."""
        now = scan(self.roots, self.skip)
        out = [Change(p, "changed", fields=_differs(e, now[p])) for p, e in self.before.items() if p in now and now[p] != e and not self._same_bytes(p, e, now[p])]
        out += [Change(p, "removed") for p in self.before if p not in now]
        out += [Change(p, "created") for p in now if p not in self.before]
        # files first: a folder changes only because an entry in it did
        out.sort(key=lambda c: (stat.S_ISDIR((self.before.get(c.path) or now[c.path])[5]), c.path))
        if not out:
            self.before = now
        return out

    def _by_folder(self) -> dict[str, set[str]]:
        """The snapshot's entries by the folder they are in: made once for each new snapshot
        (a scan), then kept by `driver_wrote`, so that a commit costs the entries of the folders
        it touched, not a pass over all 5,000."""
        if self._kids_of is not self.before:
            kids: dict[str, set[str]] = {}
            for path in self.before:
                kids.setdefault(path.rpartition(os.sep)[0], set()).add(path)
            self._kids, self._kids_of = kids, self.before
        return self._kids

    def driver_wrote(self, files: list[Path], state_dir: Path) -> None:
        """The driver's own writes (a commit: targets renamed, their bytecode dropped, the state
        folder) are not the next fix's: scan again only the folders they touch."""
        kids = self._by_folder()
        dirs = {str(f.parent) for f in files}
        deep = {str(state_dir), *(str(f.parent / "__pycache__") for f in files)}
        # what the snapshot had there: the entries in each touched folder, and every entry in and under a deep one
        gone = {path for d in dirs for path in kids.get(d, ())} | {d for d in deep if d in self.before}
        stack = list(deep)
        while stack:
            for path in kids.get(stack.pop(), ()):
                gone.add(path)
                stack.append(path)
        for path in gone:
            del self.before[path]
            kids[path.rpartition(os.sep)[0]].discard(path)
        now: dict[str, Entry] = {}
        for d in dirs:
            try:
                with os.scandir(d) as it:
                    for e in it:
                        if e.path not in self.skip:
                            now[e.path] = stat_entry(e.stat(follow_symlinks=False))
            except OSError:
                continue
            now[d] = stat_entry(os.lstat(d))
        now.update(scan([Path(d) for d in deep], self.skip))
        self.before.update(now)
        for path in now:
            kids.setdefault(path.rpartition(os.sep)[0], set()).add(path)
        if self.keep_bytes:
            for f in files:
                try:
                    self.data[str(f)] = f.read_bytes()
                except OSError:
                    self.data.pop(str(f), None)

    def restore(self, changes: list[Change]) -> None:
        """Put back what a fix's process changed: created entries go (deepest first), removed
        and changed files get their bytes, mode and times back where the driver has them. Every
        write is made through a descriptor of the entry's folder, walked from its package folder
        without following a symlink (fixpack.apply.dirfd): a folder replaced on the way is refused."""
        created = sorted((c for c in changes if c.what == "created"), key=lambda c: -c.path.count(os.sep))
        others = sorted((c for c in changes if c.what != "created"), key=lambda c: c.path.count(os.sep))
        self._made = {}
        for c in created + others:
            try:
                self._restore_one(c)
            except ParentReplaced:
                c.replaced, c.how = True, "a parent was replaced during the run; nothing was restored through it"
            except Exception as exc:  # noqa: BLE001 - each change is reported with what went wrong
                c.how = f"could not restore it: {exc}"

    def _ident(self, path: str) -> tuple | None:
        """The (device, inode) a folder on the way must have: as in the snapshot, or as made again."""
        if path in self._made:
            return self._made[path]
        e = self.before.get(path)
        return None if e is None else e[:2]

    def _root_of(self, path: str) -> str:
        roots = [str(r) for r in self.roots if path == str(r) or path.startswith(str(r) + os.sep)]
        if not roots:
            raise ParentReplaced(path, "not under a package folder")
        return max(roots, key=len)

    def _restore_one(self, c: Change) -> None:
        p = c.path
        root = self._root_of(p)
        if p == root:  # the package folder itself: its mode, on a descriptor
            fd = dirfd.open_dir(root, self._ident)
            try:
                old = self.before[p]
                dirfd.set_metadata(fd, uid=old[6], gid=old[7], mode=stat.S_IMODE(old[5]), mtime_ns=None)
            finally:
                os.close(fd)
            c.restored, c.how = True, "folder mode put back"
            return
        pfd, name = dirfd.open_parent(root, p, self._ident)
        try:
            self._restore_at(c, pfd, name)
        finally:
            os.close(pfd)

    def _restore_at(self, c: Change, pfd: int, name: str) -> None:
        p = c.path
        if c.what == "created":
            dirfd.remove_tree_at(pfd, name)  # a folder with everything in it; a symlink as an entry
            c.restored, c.how = True, "removed"
            return
        old = self.before[p]
        mode = stat.S_IMODE(old[5])
        if stat.S_ISDIR(old[5]):
            if c.what == "removed":
                os.mkdir(name, 0o700, dir_fd=pfd)  # its mode below, on the descriptor (mkdir's is masked)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    kind = "a symlink" if exc.errno == errno.ELOOP or os.path.islink(p) else "another file type"
                    c.replaced, c.how = True, f"replaced by {kind} during the run (it was a folder); nothing was restored through it"
                    return
                raise
            try:
                st = os.fstat(fd)
                if c.what == "removed":
                    self._made[p] = (st.st_dev, st.st_ino)
                elif (st.st_dev, st.st_ino) != old[:2]:
                    c.replaced, c.how = True, "replaced by another folder during the run; nothing was restored through it"
                    return
                dirfd.set_metadata(fd, uid=old[6], gid=old[7], mode=mode, mtime_ns=None)
            finally:
                os.close(fd)
            c.restored, c.how = True, "folder mode put back" if c.what != "removed" else "folder made again"
            return
        if not stat.S_ISREG(old[5]):
            c.how = "not a regular file; restore it by reinstalling its package"
            return
        try:
            cur: os.stat_result | None = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            cur = None
        same_bytes = cur is not None and stat.S_ISREG(cur.st_mode) and (cur.st_dev, cur.st_ino, cur.st_size) == old[:3] and cur.st_mtime_ns == old[3]
        if p in self.data:
            if cur is not None and not stat.S_ISREG(cur.st_mode) and not stat.S_ISLNK(cur.st_mode):
                raise OSError(f"{p} is now not a file")
            # a symlink put there is replaced as an entry by the rename, never written through
            dirfd.write_at(pfd, name, self.data[p], uid=old[6], gid=old[7], mode=old[5], mtime_ns=old[3])
            c.restored, c.how = True, "bytes, mode and mtime put back from the copy taken before the fix ran"
        elif not self.keep_bytes and same_bytes:
            # the kernel kept the bytes (Landlock does not govern metadata); only mode or times moved
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=pfd)
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != old[:2]:
                    c.replaced, c.how = True, "replaced by another file during the run; nothing was restored through it"
                    return
                dirfd.set_metadata(fd, uid=old[6], gid=old[7], mode=mode, mtime_ns=old[3])
            finally:
                os.close(fd)
            c.restored, c.how = True, "mode and mtime put back (the bytes were not changed)"
        else:
            c.how = "its bytes were not kept (larger than the copy limit, or the kernel was trusted to keep them); reinstall its package"
