"""The destination folder: plan, claims, unit records, atomic files, crash points.

    DST/model-0000i-of-0000n.safetensors     one per work unit
    DST/.glm5_mxfp4/plan.json                what this folder is a conversion of (source index sha256, mode)
    DST/.glm5_mxfp4/claims/<worker>.json     the units each worker owns; overlapping claims are refused
    DST/.glm5_mxfp4/units/<unit>.json        a finished unit: input fingerprint and tensor hashes, output hash
    DST/.glm5_mxfp4/lock                     flock for the plan/claims critical section
Everything is written under a temporary name, fsynced, renamed, and the folder fsynced.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal

STATE = ".glm5_mxfp4"
FORMAT = 1
_crash_counter = 0


def crashpoint(label: str) -> None:
    """A write point. GLM5_MXFP4_CRASH_AT=N kills the process (SIGKILL) at the N-th one;
    GLM5_MXFP4_CRASH_LOG=FILE appends each label, so a test can enumerate them."""
    global _crash_counter
    at = os.environ.get("GLM5_MXFP4_CRASH_AT")
    log = os.environ.get("GLM5_MXFP4_CRASH_LOG")
    if not at and not log:
        return
    _crash_counter += 1
    if log:
        with open(log, "a") as f:
            f.write(f"{_crash_counter}\t{label}\n")
    if at and int(at) == _crash_counter:
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_name(path: str) -> str:
    d, b = os.path.split(path)
    return os.path.join(d, f".{b}.tmp")


def write_atomic(path: str, data: bytes, label: str) -> None:
    tmp = tmp_name(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    crashpoint(f"{label}: written, before rename")
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))
    crashpoint(f"{label}: renamed")


def dump(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def load(path: str):
    with open(path) as f:
        return json.load(f)


class Dest:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.state = os.path.join(self.root, STATE)
        self.plan_path = os.path.join(self.state, "plan.json")

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def record_path(self, unit: str) -> str:
        return os.path.join(self.state, "units", f"{unit}.json")

    def claim_path(self, worker: str) -> str:
        return os.path.join(self.state, "claims", f"{worker}.json")

    def foreign_content(self) -> list[str]:
        """Entries that show DST is not (the start of) a conversion: anything, when there is no state folder."""
        if not os.path.exists(self.root):
            return []
        if not os.path.isdir(self.root):
            return [self.root]
        names = sorted(os.listdir(self.root))
        if STATE in names:
            return []
        return names

    def existing_plan(self):
        return load(self.plan_path) if os.path.isfile(self.plan_path) else None

    @contextlib.contextmanager
    def locked(self):
        fd = os.open(os.path.join(self.state, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def create_plan(self, plan: dict) -> bool:
        """Publish the plan unless one exists; called under `locked()`. True if this call made it."""
        tmp = tmp_name(self.plan_path)
        with open(tmp, "wb") as f:
            f.write(dump(plan))
            f.flush()
            os.fsync(f.fileno())
        crashpoint("plan: written, before link")
        try:
            os.link(tmp, self.plan_path)
            made = True
        except FileExistsError:
            made = False
        finally:
            os.unlink(tmp)
        fsync_dir(self.state)
        crashpoint("plan: linked")
        return made

    def claims(self) -> dict[str, list[str]]:
        d = os.path.join(self.state, "claims")
        out = {}
        if os.path.isdir(d):
            for name in sorted(os.listdir(d)):
                if name.endswith(".json") and not name.startswith("."):
                    out[name[:-5]] = load(os.path.join(d, name))["units"]
        return out
