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
from fixpack.apply.dirfd import BoundExceeded, ParentReplaced
from fixpack.apply.store import stat_entry
from fixpack.cli.output import printable

KEEP_BYTES_UP_TO = 8 << 20  # every .py file; a large binary is named for reinstalling instead

Entry = tuple  # (dev, ino, size, mtime_ns, ctime_ns, mode, uid, gid)


# Bounds of one scan: deeper or larger trees are shaped to exhaust the driver (its stack, its
# memory, its time), not installed. vLLM's deepest path is 8 levels, torch's 11; vLLM has
# about 3,000 entries, torch 12,000.
WALK_DEPTH = 64
WALK_ENTRIES = 500_000
# Past this size a file's bytes are neither kept nor hashed: its (inode, size, times) decide.
DIGEST_UP_TO = 1 << 30


def scan(roots: list[Path], skip: set[str], deep: list[str] | None = None) -> dict[str, Entry]:
    """(device, inode, size, times, mode, owner) of every entry under ``roots``, ``skip`` aside.

    Iterative, never following a symlink. A folder ``WALK_DEPTH`` levels below its root is
    recorded but not entered: its path goes into ``deep`` (the caller decides; without
    ``deep``, `BoundExceeded`). More than ``WALK_ENTRIES`` entries in all is `BoundExceeded`."""
    out: dict[str, Entry] = {}
    for r in roots:
        try:
            out[str(r)] = stat_entry(os.lstat(r))
        except OSError:
            continue
        stack = [(str(r), 0)]
        while stack:
            d, depth = stack.pop()
            try:
                it = os.scandir(d)
            except OSError as exc:
                if exc.errno == errno.ENAMETOOLONG:  # only a chain made to be deep reaches it
                    _too_deep(d, str(r), deep)
                continue
            with it:
                for e in it:
                    if e.path in skip:
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    out[e.path] = stat_entry(st)
                    if len(out) > WALK_ENTRIES:
                        raise BoundExceeded(
                            str(r), f"more than {WALK_ENTRIES} entries under it (with {', '.join(map(str, roots))}); fixpack walks no "
                            "further: a tree shaped to exhaust the driver, not an installed package"
                        )
                    if stat.S_ISDIR(st.st_mode):
                        if depth + 1 >= WALK_DEPTH:
                            _too_deep(e.path, str(r), deep)
                        else:
                            stack.append((e.path, depth + 1))
    return out


def _too_deep(path: str, root: str, deep: list[str] | None) -> None:
    if deep is None:
        raise BoundExceeded(
            printable(path), f"folders nested deeper than {WALK_DEPTH} levels below {root}; fixpack walks no deeper: a tree "
            "shaped to exhaust the driver, not an installed package"
        )
    deep.append(path)


def _read_entry(path: str, e: Entry) -> bytes | str | None:
    """What the snapshot keeps of the file it saw at ``path``: its bytes up to
    ``KEEP_BYTES_UP_TO``, else its sha256 up to ``DIGEST_UP_TO``, else None. Not through a
    symlink put there since, never blocking, and only if it is the same inode and still a
    regular file (a folder on the way swapped for a symlink would otherwise have the driver
    keep, and later put back here, the bytes of a file outside the tree)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != tuple(e[:2]) or not stat.S_ISREG(st.st_mode) or st.st_size > DIGEST_UP_TO:
            return None
        if st.st_size <= KEEP_BYTES_UP_TO:
            data = os.read(fd, KEEP_BYTES_UP_TO + 1)
            return data if len(data) <= KEEP_BYTES_UP_TO else None  # grew meanwhile
        h = hashlib.sha256()
        left = DIGEST_UP_TO + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
        return h.hexdigest() if left > 0 else None
    except OSError:
        return None
    finally:
        os.close(fd)


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
        # the name may be one a fix's process chose: escaped (fixpack.cli.output.printable)
        if self.replaced:
            return f"{printable(self.path)}: {self.how}"
        fields = f" ({self.fields})" if self.fields else ""
        return f"{printable(self.path)}: {self.what}{fields}; {'restored' if self.restored else 'NOT restored'} ({printable(self.how)})"


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
        """The snapshot a fix's process is compared with. A tree deeper or larger than the walk's
        bounds is refused (`BoundExceeded`, exit 6): nothing has run yet."""
        old = self.before
        try:
            self.before = scan(self.roots, self.skip)
        except BoundExceeded as exc:
            raise BoundExceeded(exc.path, f"{exc.what}; nothing was changed") from None
        if not self.keep_bytes:
            return
        for path, e in self.before.items():
            if stat.S_ISREG(e[5]) and (path not in self.data and path not in self.digest or old.get(path) != e):
                kept = _read_entry(path, e)
                self.data.pop(path, None)
                self.digest.pop(path, None)
                if isinstance(kept, bytes):
                    self.data[path] = kept
                elif isinstance(kept, str):
                    self.digest[path] = kept
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
        now = _read_entry(path, new)
        if path in self.data:
            return isinstance(now, bytes) and now == self.data[path]
        return isinstance(now, str) and now == self.digest.get(path)

    def changes(self) -> list[Change]:
        """What differs from the snapshot; the scan made for it is the next fix's snapshot."""
        deep: list[str] = []
        now = scan(self.roots, self.skip, deep)
        out = [Change(p, "changed", fields=_differs(e, now[p])) for p, e in self.before.items() if p in now and now[p] != e and not self._same_bytes(p, e, now[p])]
        out += [Change(p, "removed") for p in self.before if p not in now]
        # a created folder is one change, whatever it holds: removing it takes it all (at any
        # depth, fixpack.apply.dirfd.remove_tree_at), and the message stays one line for it
        created = {p for p in now if p not in self.before}
        inside: dict[str, int] = {}
        for p in created:
            top = p
            while os.path.dirname(top) in created:
                top = os.path.dirname(top)
            inside[top] = inside.get(top, 0) + (top != p)
        below = {top: any(d.startswith(top + os.sep) for d in deep) for top in inside}
        for top, n in inside.items():
            more = f"{n} entries in it" if n else ""
            if below[top]:
                more += f"{', and' if more else ''} folders nested deeper than {WALK_DEPTH} levels"
            out.append(Change(top, "created", fields=more))
        # a chain deeper than the walk goes that hangs from no created entry is named, not walked
        for d in deep:
            if not any(d == t or d.startswith(t + os.sep) for t in inside):
                out.append(Change(d, "changed", how=f"holds folders nested deeper than {WALK_DEPTH} levels; not walked", fields="depth"))
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
                seen = self.before.get(str(f))
                kept = _read_entry(str(f), seen) if seen is not None else None
                self.data.pop(str(f), None)
                self.digest.pop(str(f), None)
                if isinstance(kept, bytes):
                    self.data[str(f)] = kept
                elif isinstance(kept, str):
                    self.digest[str(f)] = kept

    def restore(self, changes: list[Change]) -> None:
        """Put back what a fix's process changed: created entries go (deepest first), removed
        and changed files get their bytes, mode and times back where the driver has them. Every
        write is made through a descriptor of the entry's folder, walked from its package folder
        without following a symlink (fixpack.apply.dirfd): a folder replaced on the way is refused."""
        created = sorted((c for c in changes if c.what == "created"), key=lambda c: -c.path.count(os.sep))
        others = sorted((c for c in changes if c.what != "created"), key=lambda c: c.path.count(os.sep))
        self._made = {}
        for c in created + others:
            if c.fields == "depth":  # not walked: nothing known to put back
                continue
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
            if cur is not None and stat.S_ISDIR(cur.st_mode):
                raise OSError(f"{printable(p)} is now a folder")
            # a symlink, FIFO, socket or device put there is replaced as an entry by the rename,
            # never opened nor written through
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
