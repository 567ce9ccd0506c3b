"""Applies one fix in its own process: a child of fixpack.sandbox.forkserver, or
``python -m fixpack.sandbox.worker`` with a JSON job on stdin.

The job names the fix folder, its kind, and for each declared target the file to read and
the staging file to write. The worker never writes anywhere else. First the process gives up
its privileges (fixpack.sandbox.privilege: no capability in any set, no_new_privs). Then two guards, in
this order: the kernel (Landlock, fixpack.sandbox.landlock: writes only beneath the staging folder, no
program started; and a seccomp filter, fixpack.sandbox.seccomp: no change of mode, owner, times or
xattrs, no privileged or cross-process call, no new process), where the kernel has them; then
an audit hook that refuses the same in Python, so that a
mistake gets a clear message. The hook alone can be bypassed (ctypes, for one); that is why,
unless the kernel sealed the process, the driver also compares a snapshot of the trees after
the process ends (fixpack.sandbox.watch). The first line the process prints says which walls stand,
before any code of the fix runs. The driver checks the staged bytes against the pins and
commits them; nothing here touches a target.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from pathlib import Path

SANDBOX_MODES = ("auto", "landlock", "hook")


def confine(stage_dir: str, mode: str, limits: dict | None = None) -> dict:
    """Take away the process's privileges and put the kernel's walls up where it has them.
    ``mode``: auto (Landlock when the kernel has it, else the audit hook alone, said in the
    result), landlock (required), hook (Landlock and the metadata filter forced off). In every
    mode the capabilities are dropped and the seccomp filter refuses the privileged and
    cross-process calls (fixpack.sandbox.seccomp): neither needs Landlock. Returns what is in force,
    for the state record."""
    from fixpack.sandbox import privilege

    if limits:  # before the capabilities go: without CAP_SYS_RESOURCE they can never be raised again
        from fixpack.sandbox import limits as rlimits

        rlimits.apply(limits)
    dropped = privilege.drop_all()  # first: Landlock and seccomp need no privilege, and a fix gets none
    if mode == "hook":
        got: dict = {"sandbox": "audit-hook", "reason": "Landlock forced off (FIXPACK_SANDBOX=hook)"}
    else:
        from fixpack.sandbox.landlock import Unavailable
        from fixpack.sandbox.landlock import confine as landlock_confine

        try:
            got = {"sandbox": "landlock", "abi": landlock_confine(stage_dir)}
        except Unavailable as exc:
            if mode == "landlock":
                raise PermissionError(f"FIXPACK_SANDBOX=landlock, but Landlock cannot confine this process: {exc}") from None
            got = {"sandbox": "audit-hook", "reason": str(exc)}
    got.update(dropped)
    # With Landlock, the filter takes metadata too (Landlock leaves mode, owner, times, xattrs
    # free); without it, the snapshot finds a metadata change, and the filter refuses the rest.
    from fixpack.sandbox import seccomp

    landlock = got["sandbox"] == "landlock"
    try:
        seccomp.install(metadata=landlock)
        if landlock:
            got["seccomp"] = True
        else:
            got["syscall_filter"] = "privileged calls"
    except seccomp.Unavailable as exc:
        if landlock:
            got.update(seccomp=False, seccomp_reason=str(exc))
        else:
            got["syscall_filter"] = f"none: {exc}"
    return got


def sealed(protection: dict | None) -> bool:
    """The kernel alone keeps the process from changing anything outside its stage: Landlock
    with truncate governed (ABI 3) and the metadata filter both in force."""
    p = protection or {}
    return p.get("sandbox") == "landlock" and int(p.get("abi") or 0) >= 3 and p.get("seccomp") is True


def _guard_writes(allowed_dir: str) -> None:
    allowed = os.path.realpath(allowed_dir) + os.sep
    # event -> (position of a path it writes, position of that path's dir_fd or None), per path
    write_events: dict[str, list[tuple[int, int | None]]] = {
        "os.remove": [(0, 1)], "os.rmdir": [(0, 1)], "os.mkdir": [(0, 2)], "os.truncate": [(0, None)],
        "os.chmod": [(0, 2)], "os.chown": [(0, 3)], "os.utime": [(0, 3)], "shutil.rmtree": [(0, 1)],
        "os.rename": [(0, 2), (1, 3)], "os.replace": [(0, 2), (1, 3)], "os.symlink": [(1, 2)],
        # a hard link of a tree file into the stage would let the fix write the tree file's bytes
        "os.link": [(0, 2), (1, 3)],
    }
    spawn_events = {"os.system", "subprocess.Popen", "os.fork", "os.forkpty", "pty.spawn"}

    def hook(event, args):
        if event == "open":
            path, mode = args[0], args[1]
            if isinstance(mode, str):
                writing = any(c in mode for c in "wax+")
            else:
                writing = isinstance(args[2], int) and bool(args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if not writing or isinstance(path, int):
                return
            if mode is None and not os.path.isabs(os.fsdecode(path)):
                # os.open's event does not say its dir_fd, so a relative name cannot be placed
                raise PermissionError(f"fix tried to open {os.fsdecode(path)!r} for writing by a relative name (os.open, perhaps with dir_fd); outside its staging area unless named absolutely")
            check(path)
        elif event in write_events:
            for pos, fd_pos in write_events[event]:
                check(args[pos], args[fd_pos] if fd_pos is not None and fd_pos < len(args) else None)
        elif event in spawn_events or event.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
            raise PermissionError(f"fix tried to start a process ({event}); a fix computes its targets' new text and nothing else")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            raise PermissionError(f"fix tried to send a signal ({event}); a fix computes its targets' new text and nothing else")

    def check(path, dir_fd=None):
        if isinstance(path, int) or path is None:
            return
        name = os.fsdecode(path)
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(name):
            name = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)  # relative to its dir_fd, not the working folder
        real = os.path.realpath(name)
        if not (real + os.sep).startswith(allowed) and not real.startswith(allowed):
            raise PermissionError(f"fix tried to write {real}, outside its staging area (fixes may only change their declared targets)")

    sys.addaudithook(hook)


def run(job: dict) -> dict:
    from fixpack import kinds

    fix_dir = Path(job["fix_dir"])
    kind = kinds.kind(job["kind"])
    sources = {t["rel"]: Path(t["src"]).read_bytes() for t in job["targets"]}
    applied = kind.apply(fix_dir, sources, known=job.get("definitions"))
    result = applied.outputs
    if job.get("check_idempotent") and kind.idempotent:
        again = kind.apply(fix_dir, result).outputs
        for rel in result:
            if again[rel] != result[rel]:
                raise ValueError(f"{fix_dir / kind.change_file}: not idempotent on {rel}: a second run changes its own output")
    outputs: dict[str, str] = {}
    for t in job["targets"]:
        Path(t["out"]).write_bytes(result[t["rel"]])
        outputs[t["rel"]] = t["out"]
    # Every output must at least be valid Python that compiles, unless it is byte for byte the
    # pinned result (the lock compiled that one when it recorded the pin; the driver checks it).
    expect = job.get("expect") or {}
    for rel, out in outputs.items():
        if rel.endswith(".py"):
            data = Path(out).read_bytes()
            if expect.get(rel) and hashlib.sha256(data).hexdigest() == expect[rel]:
                continue
            try:
                compile(data, rel, "exec", dont_inherit=True)
            except SyntaxError as exc:
                raise ValueError(f"the fixed {rel} does not compile: {exc.msg} at line {exc.lineno}") from exc
    return {"outputs": outputs, "located": applied.located}


def execute(job: dict) -> int:
    """Confine the process, guard writes, compute the fix's outputs, print the result as one JSON line."""
    try:
        protection = confine(job["stage_dir"], job.get("sandbox", "auto"), job.get("limits"))
    except PermissionError as exc:
        print(json.dumps({"protection": {"sandbox": "none"}}))
        print(json.dumps({"error": f"{exc}", "protection": {"sandbox": "none"}}))
        return 1
    # The first line of output, written before the fix is even loaded: the driver reads what
    # confined this process from it, and no code of the fix can write ahead of it.
    print(json.dumps({"protection": protection}), flush=True)
    _guard_writes(job["stage_dir"])
    try:
        result = run(job)
    except Exception as exc:  # reported to the driver; the driver decides the exit code
        report: dict = {"error": f"{type(exc).__name__}: {exc}", "protection": protection}
        if isinstance(exc, OSError) and exc.errno:
            report["errno"] = exc.errno  # a full or read-only disk is the environment's fault, not the fix's
            if protection["sandbox"] == "landlock" and exc.errno in (errno.EACCES, errno.EPERM, errno.EXDEV):
                walls = f"Landlock ABI {protection['abi']}" + (" + seccomp" if protection.get("seccomp") else "")
                report["error"] = f"refused by the kernel ({walls}): {report['error']}"
            elif protection.get("syscall_filter") == "privileged calls" and exc.errno == errno.EPERM:
                # no Landlock: EPERM comes from the filter or from the dropped capabilities
                report["error"] = f"refused by the kernel (seccomp, no capabilities): {report['error']}"
        print(json.dumps(report))
        return 1
    result["protection"] = protection
    print(json.dumps(result))
    return 0


def main() -> int:
    return execute(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(main())
