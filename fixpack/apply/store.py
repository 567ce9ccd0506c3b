"""The state beside the targets: state record, journal, content-addressed backups, lock.

Layout of ``<state_dir>`` (``.fixpack`` next to the package folders):
  state.json    what is applied: profile, selection, ordered fixes, per-file before/after hashes
  journal.json  present only while a fix is being committed; lets the next run finish it
  objects/      every file content fixpack ever replaced or wrote, by sha256 (exact revert)
  lock          flock'ed for the whole run
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import time
from pathlib import Path

from fixpack.apply import dirfd
from fixpack.apply.hashing import sha256_bytes
from fixpack.apply.state import Journal, StateRecord, Unreadable
from fixpack.errors import Drift, EnvironmentFault, Locked

STATE_FORMAT = 1

# ---- crash points (reliability tests kill the process at the N-th write point)
_crash_counter = 0


def crashpoint(label: str) -> None:
    """A write point. FIXPACK_CRASH_AT=N kills the process (SIGKILL) at the N-th one;
    FIXPACK_CRASH_LOG=FILE appends each label, so a test can enumerate them."""
    global _crash_counter
    at = os.environ.get("FIXPACK_CRASH_AT")
    log = os.environ.get("FIXPACK_CRASH_LOG")
    if not at and not log:
        return
    _crash_counter += 1
    if log:
        with open(log, "a") as f:
            f.write(f"{_crash_counter}\t{label}\n")
    if at and int(at) == _crash_counter:
        os.kill(os.getpid(), signal.SIGKILL)


def fs_error(exc: OSError, what: str) -> EnvironmentFault:
    reason = {
        errno.ENOSPC: "no space left on device",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.EDQUOT: "disk quota exceeded",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return EnvironmentFault(f"{what}: {reason}")


def stat_entry(st: os.stat_result) -> tuple:
    """A file's state short of its bytes: (dev, ino, size, mtime_ns, ctime_ns, mode, uid, gid).
    A write through any name moves the ctime, a rename the inode."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid, st.st_gid)


def _lstat_entry(path: Path) -> tuple | None:
    try:
        return stat_entry(os.lstat(path))
    except OSError:
        return None


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, like: os.stat_result | None = None, label: str = "") -> None:
    """Stage next to ``path``, fsync, keep mode and owner, rename over it, fsync the folder."""
    tmp = path.with_name(f".{path.name}.fixpack-tmp")
    try:
        try:
            os.unlink(tmp)  # left by a killed run, or planted (a symlink): never opened, never written through
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
            if like is not None:  # on the descriptor, owner first: chown clears setuid/setgid bits
                try:
                    os.fchown(fd, like.st_uid, like.st_gid)
                except PermissionError:
                    pass
                os.fchmod(fd, like.st_mode & 0o7777)
        finally:
            os.close(fd)
        crashpoint(f"staged {label or path.name}")
        os.replace(tmp, path)
        crashpoint(f"renamed {label or path.name}")
        fsync_dir(path.parent)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise fs_error(exc, f"cannot write {path}") from exc


def replace_in_tree(root: Path, path: Path, data: bytes, *, label: str = "") -> None:
    """`atomic_write` for a file of a package folder (``root``), made entirely through a
    descriptor of its folder, walked from ``root`` without following a symlink (fixpack.apply.dirfd):
    a folder on the way swapped during the run is refused (exit 6), never written through. The
    new file keeps the old one's owner and mode."""
    pfd, name = dirfd.open_parent(str(root), str(path), lambda _: None, done="written")
    try:
        try:
            like = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except OSError as exc:
            raise fs_error(exc, f"cannot stat {path}") from exc
        atomic_write_at(pfd, name, data, path=path, label=label or path.name, like=like)
    finally:
        os.close(pfd)


def atomic_write_at(dir_fd: int, name: str, data: bytes, *, path: Path, label: str, like: os.stat_result | None = None) -> None:
    """`atomic_write` relative to a folder descriptor, with the same crash points: staged beside
    ``name`` (a leftover or planted stage is removed, never written through), synced, renamed over
    it, the folder synced. With ``like``, the new file takes that file's owner and mode."""
    tmp = f".{name}.fixpack-tmp"
    try:
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # left by a killed run, or planted: never written through
        except FileNotFoundError:
            pass
        mode = 0o600 if like is not None else 0o644
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            if like is not None:
                try:  # owner first: chown clears setuid/setgid bits
                    os.fchown(fd, like.st_uid, like.st_gid)
                except PermissionError:
                    pass
                os.fchmod(fd, like.st_mode & 0o7777)
        finally:
            os.close(fd)
        crashpoint(f"staged {label}")
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        crashpoint(f"renamed {label}")
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
    except OSError as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise fs_error(exc, f"cannot write {path}") from exc


def drop_bytecode(path: Path, root: Path | None = None) -> None:
    """A rewritten .py must never run as its stale .pyc. With ``root`` (its package folder), the
    __pycache__ folder is reached through descriptors, as `replace_in_tree` reaches the file."""
    if root is not None:
        pfd, _ = dirfd.open_parent(str(root), str(path), lambda _: None, done="removed")
        try:
            try:
                cfd = os.open("__pycache__", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink planted there: never followed
                    raise dirfd.ParentReplaced(str(path.parent / "__pycache__"), "not a folder", done="removed") from None
                raise fs_error(exc, f"cannot open {path.parent / '__pycache__'}") from exc
        finally:
            os.close(pfd)
        try:
            stem = f"{path.stem}."
            for entry in os.listdir(cfd):
                if entry.startswith(stem) and entry.endswith(".pyc") and len(entry) >= len(stem) + 4:  # as glob STEM.*.pyc
                    try:
                        os.unlink(entry, dir_fd=cfd)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        raise fs_error(exc, f"cannot remove stale bytecode {path.parent / '__pycache__' / entry}") from exc
        finally:
            os.close(cfd)
        return
    cache = path.parent / "__pycache__"
    if not cache.is_dir():
        return
    for pyc in cache.glob(f"{path.stem}.*.pyc"):
        try:
            pyc.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise fs_error(exc, f"cannot remove stale bytecode {pyc}") from exc


def _hash_ok(h) -> bool:
    return isinstance(h, str) and len(h) == 64


def _files_ok(files) -> bool:
    """{rel: [before, after]} with sha256 hex strings (a record from a crash or an edit may be anything)."""
    return isinstance(files, dict) and all(
        isinstance(rel, str) and isinstance(pair, list) and len(pair) == 2 and all(_hash_ok(h) for h in pair) for rel, pair in files.items()
    )


def _steps_ok(steps) -> bool:
    return isinstance(steps, list) and all(isinstance(s, dict) and isinstance(s.get("fix"), str) and _files_ok(s.get("files")) for s in steps)


class Store:
    def __init__(self, state_dir: Path):
        self.dir = state_dir
        self.objects = state_dir / "objects"
        self.state_path = state_dir / "state.json"
        self.journal_path = state_dir / "journal.json"
        self.lock_path = state_dir / "lock"
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None  # the state folder, opened once (`_folder`)
        self._dir_owner: int | None = None
        self._objects_fd: int | None = None
        self._stored: dict[str, tuple] = {}  # objects this Store wrote or read back whole: their stat_entry

    def __del__(self) -> None:
        for fd in (self._dir_fd, self._objects_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    # ---- the folder, through descriptors
    def _folder(self, *, create: bool = True) -> int | None:
        """A descriptor of the state folder, opened once, never through a symlink at its own
        name, and only if this user owns it and no one else may write it: every read and write
        of the Store is made relative to it, so a `.fixpack` swapped for a symlink (by whoever owns
        the folder it sits in) during the run does not redirect a single one (docs/security.md).
        Without ``create`` a missing folder is None (nothing to read), and one that root owns is
        accepted too (a run as another user reads what root applied; writing there fails)."""
        if self._dir_fd is None:
            try:
                if create:
                    self.dir.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.mkdir(self.dir, 0o755)
                    except FileExistsError:
                        pass
                fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise EnvironmentFault(
                        f"{self.dir}: the state folder is {'a symlink' if os.path.islink(self.dir) else 'not a folder'}; "
                        "fixpack keeps its state and backups only in a real folder of its own; nothing was changed"
                    ) from None
                if not create and exc.errno == errno.ENOENT:
                    return None
                raise fs_error(exc, f"cannot {'create' if create else 'open'} the state folder {self.dir}") from exc
            st = os.fstat(fd)
            owners = (os.geteuid(),) if create else (os.geteuid(), 0)
            if st.st_uid not in owners or st.st_mode & 0o022:
                os.close(fd)
                raise EnvironmentFault(
                    f"{self.dir}: the state folder is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o7777)}; fixpack "
                    f"{'writes' if create else 'reads'} its state and backups only in a folder owned by the user it runs as "
                    f"(uid {os.geteuid()}{'' if create else ') or root (uid 0'}) that no one else may write (chown it and "
                    "chmod go-w, or remove it); nothing was changed"
                )
            self._dir_fd, self._dir_owner = fd, st.st_uid
        elif create and self._dir_owner != os.geteuid():
            raise EnvironmentFault(
                f"{self.dir}: the state folder is owned by uid {self._dir_owner}; fixpack writes its state and backups only "
                f"into a folder owned by the user it runs as (uid {os.geteuid()}); nothing was changed"
            )
        return self._dir_fd

    def _dir(self) -> int:
        """The state folder for a write (made if missing)."""
        fd = self._folder()
        assert fd is not None
        return fd

    def _subfolder(self, dir_fd: int, name: str, path: Path) -> int:
        """``name`` in ``dir_fd``, made if missing, opened without following a symlink."""
        try:
            try:
                os.mkdir(name, 0o755, dir_fd=dir_fd)
            except FileExistsError:
                pass
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise EnvironmentFault(f"{path}: not a folder (a symlink?) in the state folder; nothing was written through it") from None
            raise fs_error(exc, f"cannot create {path}") from exc

    def check_folder(self) -> None:
        """The state folder's path still leads to the folder this Store opened: refused (exit 6)
        if it was swapped (for a symlink, another folder) since."""
        fd = self._dir()
        try:
            st = os.stat(self.dir, follow_symlinks=False)
        except OSError:
            st = None
        mine = os.fstat(fd)
        if st is None or (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
            raise EnvironmentFault(f"{self.dir}: the state folder was replaced during the run; nothing was written through it")

    def stage(self, name: str) -> Path:
        """A fresh, empty staging folder for one fix's process, made through the state folder's
        descriptor (a symlink planted at ``staging`` or at the fix's name is never followed) and
        checked to be reachable by its path, which is what the fix's process is confined to."""
        path = self.dir / "staging" / name
        sfd = self._subfolder(self._dir(), "staging", self.dir / "staging")
        try:
            try:
                dirfd.remove_tree_at(sfd, name, path=str(path))  # left by a killed run
            except FileNotFoundError:
                pass
            os.mkdir(name, 0o700, dir_fd=sfd)
        except OSError as exc:
            raise fs_error(exc, f"cannot create {path}") from exc
        finally:
            os.close(sfd)
        self.check_folder()
        return path

    def open_stage(self, name: str) -> int:
        """A descriptor of the staging folder ``name``, through the state folder's (no symlink
        followed at ``staging`` or at ``name``): what the driver writes a fix's inputs into and
        reads its outputs from. The caller closes it. Raises EnvironmentFault when it is not a
        real folder any more (the fix's process may have replaced it, where no kernel sealed it)."""
        path = self.dir / "staging" / name
        sfd = self._subfolder(self._dir(), "staging", self.dir / "staging")
        try:
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                raise EnvironmentFault(f"{path}: the staging folder is {'gone' if exc.errno == errno.ENOENT else 'no longer a folder'}; nothing was read from it") from None
            raise fs_error(exc, f"cannot open {path}") from exc
        finally:
            os.close(sfd)

    def drop_stage(self, name: str) -> None:
        """Remove the staging folder ``name``, whatever its process left in it, at any depth
        (`dirfd.remove_tree_at`, iterative). Past the removal's bound it raises `BoundExceeded`
        (exit 6) naming the folder, and the next run's `stage` goes on removing it."""
        path = self.dir / "staging" / name
        try:
            sfd = os.open("staging", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dir())
        except OSError:
            return  # no staging folder (or not a folder: `stage` refuses it by name)
        try:
            dirfd.remove_tree_at(sfd, name, path=str(path))
        except FileNotFoundError:
            pass
        except dirfd.BoundExceeded:
            raise
        except OSError as exc:
            raise fs_error(exc, f"cannot remove the staging folder {path}") from exc
        finally:
            os.close(sfd)

    # ---- objects
    def ensure(self) -> None:
        if self._objects_fd is None:
            self._objects_fd = self._subfolder(self._dir(), "objects", self.objects)

    def _read_object(self, h: str) -> bytes | None:
        """The bytes stored under ``h`` (None: none there), read through the objects folder's
        descriptor; a FIFO, a device, a folder or a symlink there, or an object over the read
        bound, raises `dirfd.NotRegular`."""
        self.ensure()
        assert self._objects_fd is not None
        try:
            sub = os.open(h[:2], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._objects_fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise dirfd.NotRegular(str(self.objects / h[:2]), "not a folder (a symlink?); not read through") from None
            raise fs_error(exc, f"cannot open {self.objects / h[:2]}") from exc
        try:
            return dirfd.read_at(sub, h[2:], limit=dirfd.READ_BOUND, path=str(self.objects / h[:2] / h[2:]))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise fs_error(exc, f"cannot read {self.objects / h[:2] / h[2:]}") from exc
        finally:
            os.close(sub)

    def put(self, data: bytes) -> str:
        """Store ``data`` (once: an object already there with these bytes is kept); its sha256."""
        h = sha256_bytes(data)
        path = self.objects / h[:2] / h[2:]
        # A fix's old bytes are the previous fix's new ones, stored by this run a moment ago: an
        # object whose inode, size, times and mode are as this Store left them is not read back.
        known = self._stored.get(h)
        if known is not None and _lstat_entry(path) == known:
            return h
        try:
            there = self._read_object(h)
        except dirfd.NotRegular:
            there = None  # a FIFO, a device or an oversized file planted there: replaced below
        if there is None or sha256_bytes(there) != h:
            assert self._objects_fd is not None
            sub = self._subfolder(self._objects_fd, h[:2], path.parent)
            try:
                atomic_write_at(sub, h[2:], data, path=path, label=f"object {h[:12]}")
            finally:
                os.close(sub)
        now = _lstat_entry(path)
        if now is not None:
            self._stored[h] = now
        return h

    def get(self, h: str) -> bytes:
        path = self.objects / h[:2] / h[2:]
        try:
            data = self._read_object(h)
        except dirfd.NotRegular as exc:
            raise Drift(f"backup {exc.path} is {exc.what}; cannot restore those exact bytes from it") from None
        if data is None:
            raise Drift(f"backup {h[:12]} is missing from {self.objects}; cannot restore those exact bytes")
        if sha256_bytes(data) != h:
            raise Drift(f"backup {path} is corrupt (its content does not hash to its name)")
        return data

    def has(self, h: str) -> bool:
        try:
            return self._read_object(h) is not None
        except dirfd.NotRegular:
            return False

    # ---- state record and journal
    def _read_json(self, name: str, path: Path) -> dict | Unreadable | None:
        """``name`` in the state folder as a JSON object: read through the folder's descriptor,
        after its owner and mode are checked (`_folder`), never through a symlink, never from a
        FIFO or device, and at most `dirfd.STATE_BOUND` bytes. None when it is not there."""
        fd = self._folder(create=False)
        if fd is None:
            return None
        try:
            raw = dirfd.read_at(fd, name, limit=dirfd.STATE_BOUND, path=str(path))
        except FileNotFoundError:
            return None
        except dirfd.NotRegular as exc:
            return Unreadable(str(exc))
        except OSError as exc:
            raise fs_error(exc, f"cannot read {path}") from exc
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the parser's stack
            return Unreadable(f"{path} is not JSON")
        return data if isinstance(data, dict) else Unreadable(f"{path} does not hold a JSON object")

    def has_journal(self) -> bool:
        """Whether the state folder holds a journal entry (of any kind: a journal that is not a
        regular file is reported as unreadable when it is read)."""
        fd = self._folder(create=False)
        if fd is None:
            return False
        try:
            os.stat("journal.json", dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def read_state(self) -> StateRecord | Unreadable | None:
        """The state record; None when there is none, `Unreadable` when it is not one."""
        data = self._read_json("state.json", self.state_path)
        if data is None or isinstance(data, Unreadable):
            return data
        if not _steps_ok(data.get("steps", [])):
            return Unreadable(f"{self.state_path}: its steps are not [{{fix, files: {{path: [before, after]}}}}]")
        return StateRecord.from_json(data)

    def write_state(self, state: StateRecord) -> None:
        data = dict(state.to_json(), format=STATE_FORMAT, updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        atomic_write_at(self._dir(), "state.json", json.dumps(data, indent=1, sort_keys=True).encode() + b"\n", path=self.state_path, label="state.json")

    def read_journal(self) -> Journal | Unreadable | None:
        """The journal of a commit in progress; only a complete one is used."""
        data = self._read_json("journal.json", self.journal_path)
        if data is None or isinstance(data, Unreadable):
            return data
        ok = (
            data.get("op") in ("apply", "unwind")
            and _steps_ok([data.get("step")])
            and _files_ok(data.get("files"))
            and isinstance(data.get("state_base"), dict)
            and _steps_ok(data.get("steps_before"))
        )
        return Journal.from_json(data) if ok else Unreadable(f"{self.journal_path} is incomplete")

    def write_journal(self, journal: Journal) -> None:
        atomic_write_at(self._dir(), "journal.json", json.dumps(journal.to_json(), indent=1).encode(), path=self.journal_path, label="journal.json")

    def clear_journal(self) -> None:
        try:
            os.unlink("journal.json", dir_fd=self._dir())
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise fs_error(exc, f"cannot remove {self.journal_path}") from exc
        crashpoint("journal removed")

    # ---- lock
    def lock(self, timeout: float) -> None:
        import fcntl

        self.ensure()
        try:
            # private: a lock another user could open could be held by them (flock needs only a
            # read descriptor), and no run would start
            fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=self._dir())
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                what = "a symlink" if exc.errno == errno.ELOOP else "a folder"
                raise EnvironmentFault(f"{self.lock_path}: the lock is {what}; remove it; nothing was written through it") from None
            raise fs_error(exc, f"cannot open the lock {self.lock_path}") from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise EnvironmentFault(
                f"{self.lock_path}: the lock is {dirfd.kind_of(st.st_mode)} owned by uid {st.st_uid}, not a regular file of uid "
                f"{os.geteuid()}; remove it; nothing was changed"
            )
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # a lock made by an earlier version (0644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise Locked(f"another fixpack run holds {self.lock_path} for more than {timeout:.0f} s; wait for it or check for a hung process") from None
                time.sleep(0.05)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
