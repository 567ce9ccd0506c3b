"""The container-start re-check: is the requested selection already applied?

Runs before anything else is imported (no YAML, no libcst, no gitpython, no worker): reads
the lock and the state record as JSON and hashes the target files. Any doubt returns False
and the full engine takes over, which re-checks everything itself.
"""

from __future__ import annotations

import json
import os

from fixpack.apply import dirfd, hashing
from fixpack.apply.locations import layer_port, locate, lock_path
from fixpack.apply.locations import state_dir as state_folder
from fixpack.kinds import CHANGE_FILES


def _sha(root: str, path: str) -> str | None:
    """A target's sha256, read as the engine reads it (fixpack.apply.dirfd.read_under); None on any doubt."""
    try:
        return hashing.sha256_bytes(dirfd.read_under(root, path))
    except (OSError, dirfd.NotRegular, dirfd.ParentReplaced):
        return None


def _state(state_dir: str) -> dict | None:
    """The state record, read as the Store reads it: through the state folder's descriptor, only
    if its owner is this user or root and no one else may write it, never through a symlink,
    from a FIFO or past its bound; None (the full engine decides) if anything is off or a
    journal is there."""
    try:
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            return None
        try:
            os.stat("journal.json", dir_fd=fd, follow_symlinks=False)
            return None
        except FileNotFoundError:
            pass
        return json.loads(dirfd.read_at(fd, "state.json", limit=dirfd.STATE_BOUND))
    except (OSError, ValueError, RecursionError, dirfd.NotRegular):
        return None
    finally:
        os.close(fd)


def fix_hash(fix_dir: str, release: str | None = None) -> str | None:
    """pack.Fix.content_hash on ``release`` (hashing.fix_hash), with the change file found
    without parsing fix.yaml: the release's own (fixes/<id>/<release>/, a refreshed release)
    or the shared one; None when that is not exactly one file."""
    change = []
    for folder in ([os.path.join(fix_dir, release)] if release else []) + [fix_dir]:
        change = [os.path.join(folder, n) for n in CHANGE_FILES.values() if os.path.isfile(os.path.join(folder, n))]
        if change:
            break
    if len(change) != 1:
        return None
    return hashing.fix_hash(fix_dir, change[0])


def hash_known(lock_entry: dict, recorded: str | None) -> bool:
    """Whether a state record's fix hash names the fix the lock pins: its hash now, or an
    earlier one of the same fix whose pinned files the lock carried over unchanged (``earlier``:
    an image applied before fix.yaml was rewritten, e.g. into per-release entries, is still
    the state this lock pins)."""
    return recorded is not None and (recorded == lock_entry.get("hash") or recorded in (lock_entry.get("earlier") or ()))


def already_applied(pack_root: str, profile: str, opt_ins: list[str], port: str | None, root: str | None, state_dir: str | None) -> dict | None:
    """The pinned selection if the files and the state record are exactly at its end state."""
    try:
        return _already_applied(pack_root, profile, opt_ins, port, root, state_dir)
    except Exception:  # a malformed state record or lock: any doubt goes to the full engine
        return None


def _already_applied(pack_root: str, profile: str, opt_ins: list[str], port: str | None, root: str | None, state_dir: str | None) -> dict | None:
    try:
        with open(lock_path(pack_root, profile), "rb") as f:
            lock = json.load(f)
        packages = locate(lock["packages"], root)
        if len(packages) != len(lock["packages"]):
            return None
        state = _state(state_folder(packages.values(), root, state_dir))
    except (OSError, ValueError, KeyError, ImportError):
        return None
    if not isinstance(state, dict):
        return None
    if port is None and isinstance(state.get("port"), str):
        port = state["port"]  # a port applied at image build stays applied at container start
    want = [s for s in lock.get("selections", []) if s.get("port") == port and sorted(s.get("opt_in", [])) == sorted(opt_ins)]
    if len(want) != 1 or state.get("key") != want[0]["key"]:
        return None
    sel = want[0]
    steps = state.get("steps", [])
    if [s.get("fix") for s in steps] != [s["fix"] for s in sel["steps"]]:
        return None
    final: dict[str, str] = {}
    for pinned, recorded in zip(sel["steps"], steps, strict=True):  # equal lengths: checked above
        entry = lock["fixes"][pinned["fix"]]
        port_name = layer_port(entry.get("layer", "profile"))
        base = os.path.join(pack_root, "ports", port_name, "fixes") if port_name else os.path.join(pack_root, "fixes")
        # a port's fixes apply on the port's profile, which is this one (the lock is the profile's)
        h = fix_hash(os.path.join(pack_root, entry["dir"]) if entry.get("dir") else os.path.join(base, pinned["fix"]), profile)
        if h is None or h != entry["hash"] or not hash_known(entry, recorded.get("fix_hash")):
            return None
        if recorded.get("files") != pinned["files"]:
            return None
        for rel, (_, after) in pinned["files"].items():
            final[rel] = after
    for rel, after in final.items():
        pkg, sub = rel.split("/", 1)
        if pkg not in packages:
            return None
        if _sha(packages[pkg], os.path.join(packages[pkg], sub)) != after:
            return None
    return sel
