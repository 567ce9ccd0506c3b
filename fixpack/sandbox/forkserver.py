"""One process per fix without paying an interpreter start-up and a libcst import per fix.

The driver starts one server (``python -m fixpack.sandbox.forkserver``) that imports the fix
machinery (unidiff, yaml) once and never imports a target package or a fix; when the run
has codemods, a second one (``python -m fixpack.sandbox.forkserver codemod``) imports libcst at once,
on another core while the first one's children apply the diffs and edits before them, so
that the first codemod does not wait for it. For every job the server forks a fresh child; the child installs the write guard, loads the fix and
computes its outputs (fixpack.sandbox.worker.run), exactly as a separate ``python -m fixpack.sandbox.worker``
would. A fix that crashes, hangs or misbehaves ends its own child only; the server reports
its exit status, its output and whether it was killed for the timeout.

The release check runs a fix's tests through the same server (``python -m
fixpack.sandbox.forkserver tests``, which imports what every fix test imports once): a job with
``tests`` (pytest's arguments, the environment and the working folder) runs pytest in the forked
child instead of a fix, its stderr merged into its stdout.

Protocol: one JSON job per line on the server's stdin (the worker's job, or a tests job, plus
``timeout``); one JSON reply per line on its stdout: ``{"rc", "stdout", "stderr", "timed_out"}``.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time

# What is kept of each of a child's streams: its start (the first line says what confined the
# process) and its end (the last line is the result), with the bytes between counted, not kept.
HEAD_BYTES, TAIL_BYTES = 64 << 10, 1 << 20
_PR_SET_CHILD_SUBREAPER = 36
TESTS = "tests"  # the preload of the release check's test servers


class Capture:
    """A stream's start and end, with what was left out between them counted."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        if len(self.head) < HEAD_BYTES:
            take = HEAD_BYTES - len(self.head)
            self.head += chunk[:take]
            chunk = chunk[take:]
        self.tail += chunk
        if len(self.tail) > TAIL_BYTES:
            cut = len(self.tail) - TAIL_BYTES
            self.dropped += cut
            del self.tail[:cut]

    def text(self) -> str:
        gap = f"\n[... {self.dropped} bytes of output left out ...]\n".encode() if self.dropped else b""
        return bytes(self.head + gap + self.tail).decode("utf-8", "replace")


def _children() -> list[int]:
    """This process's children (this server is single-threaded: its own task's list)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent, from /proc
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            out.append(int(name))
                except (OSError, ValueError, IndexError):
                    continue
        return out


def end_descendants() -> int:
    """Kill every process left below this server once a fix's process has ended; returns how
    many. The server is a subreaper (PR_SET_CHILD_SUBREAPER), so a descendant orphaned by its
    parent's exit, by setsid or a double fork too, becomes its child instead of init's: each is
    killed and reaped until none is left (a killed one's own children come up next round)."""
    killed = 0
    for _ in range(1000):
        kids = _children()
        if not kids:
            break
        for kid in kids:
            try:
                with open(f"/proc/{kid}/stat") as f:
                    running = f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except (OSError, IndexError):
                running = True
            try:
                os.kill(kid, signal.SIGKILL)
                killed += running  # one that had exited already (a zombie) is only reaped
            except ProcessLookupError:
                pass
        for kid in kids:
            try:
                os.waitpid(kid, 0)
            except ChildProcessError:
                pass
    return killed


def _drain(pid: int, fds: dict[int, Capture], timeout: float) -> tuple[int | None, bool, dict]:
    """Read the child's pipes until it exits and they close; kill it after ``timeout``. Once it
    has exited, whatever it left running is ended, so that no descendant holds the pipes open."""
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    pidfd: int | None
    try:
        pidfd = os.pidfd_open(pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):  # before Linux 5.3: the pipes closing says it
        pidfd = None
    deadline = time.monotonic() + timeout
    timed_out = False
    status: int | None = None
    usage = None
    killed = 0
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            if key.fd == pidfd:
                _, status, usage = os.wait4(pid, 0)
                sel.unregister(pidfd)
                killed += end_descendants()
                continue
            chunk = os.read(key.fd, 65536)
            if chunk:
                fds[key.fd].add(chunk)
            else:
                sel.unregister(key.fd)
    sel.close()
    if pidfd is not None:
        os.close(pidfd)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if status is None:
        _, status, usage = os.wait4(pid, 0)
    try:  # whatever the fix's process started (in its group) ends with it
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    killed += end_descendants()
    used: dict = {"cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "maxrss_kb": usage.ru_maxrss} if usage else {}
    if killed:
        used["killed"] = killed
    return (None if timed_out else os.waitstatus_to_exitcode(status)), timed_out, used


def _run_job(job: dict) -> dict:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fix's own process
        code = 1
        try:
            os.setpgid(0, 0)  # its own process group, so that anything it starts can be ended with it
            os.close(out_r)
            os.close(err_r)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w if TESTS in job else err_w, 2)  # a test run's log is one stream
            if TESTS in job:
                code = _pytest(job[TESTS])
            else:
                os.chdir(job["stage_dir"])
                from fixpack.sandbox.worker import execute

                code = execute(job)
        except BaseException:  # noqa: BLE001 - anything at all: the child must not return into the server loop
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(out_w)
    os.close(err_w)
    bufs = {out_r: Capture(), err_r: Capture()}
    rc, timed_out, used = _drain(pid, bufs, float(job.get("timeout", 120)))
    os.close(out_r)
    os.close(err_r)
    reply = {"rc": rc, "timed_out": timed_out, "stdout": bufs[out_r].text(), "stderr": bufs[err_r].text(), "usage": used}
    dropped = {name: bufs[fd].dropped for name, fd in (("stdout", out_r), ("stderr", err_r)) if bufs[fd].dropped}
    if dropped:
        reply["dropped"] = dropped
    return reply


def _pytest(run: dict) -> int:
    """A fix's tests in this forked child, as in a fresh interpreter: its own environment and
    working folder, no bytecode written. pytest's exit code; 3 if pytest itself could not run."""
    try:
        os.environ.clear()
        os.environ.update(run["env"])
        os.chdir(run["cwd"])
        sys.dont_write_bytecode = True
        import pytest

        rc = int(pytest.main(run["args"]))
        sys.stdout.flush()
        sys.stderr.flush()
        return rc
    except BaseException:  # noqa: BLE001 - reported as pytest's internal error, never raised into the server loop
        return 3


def serve(preload: str = "") -> int:
    # Imported once here so that no fix's process pays for them; nothing else is imported.
    from fixpack import kinds

    if preload == TESTS:
        # what every fix test imports before it reaches its tree (never the tree's own vllm /
        # vllm_gaudi: use_tree refuses them); a missing optional one costs its import later
        from fixpack.proofs.proof import PRELOAD

        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:
                pass
    elif preload:
        # a kind's own server (the codemods'): only what its process uses; its start is on the
        # way to the run's first fix of that kind (libcst and its matchers for a codemod)
        for kind in kinds.ALL.values():
            if kind.server == preload:
                kind.module()
    else:
        import unidiff  # noqa: F401
        import yaml  # noqa: F401 - an edit's edits.yaml

        import fixpack.kinds.diff  # noqa: F401
        import fixpack.kinds.diffpatch  # noqa: F401
    import fixpack.kinds.edit  # noqa: F401 - an edit, and a codemod's SCOPE, locate definitions with it
    import fixpack.sandbox.landlock  # noqa: F401 - ctypes, for each child's confinement
    import fixpack.sandbox.limits  # noqa: F401
    import fixpack.sandbox.privilege  # noqa: F401
    import fixpack.sandbox.seccomp  # noqa: F401
    import fixpack.sandbox.worker  # noqa: F401

    # A descendant of a fix's process that outlives it (setsid, a double fork) becomes this
    # server's child, not init's, and is ended after the job (end_descendants). Where prctl
    # fails, the fix's process group is still killed, and the seccomp filter refuses any new
    # process in the first place (fixpack.sandbox.seccomp).
    fixpack.sandbox.landlock._libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # What is imported stays for every child: out of the collector's reach, a child's collection
    # neither walks nor copies (copy-on-write) those objects.
    gc.freeze()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        job_kind = kinds.ALL.get(job.get("kind"))
        if job_kind is not None and f"fixpack.kinds.{job_kind.name}" not in sys.modules:
            # a kind this server did not import at its start (libcst only once a codemod comes;
            # a diff or an edit never needs it), then once for all the fixes of it after this one
            job_kind.module()
            gc.freeze()
        reply = _run_job(job)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


class ServerDied(RuntimeError):
    pass


def server_env() -> dict:
    """The servers' environment: the driver's (a fix's process reads nothing of it that matters;
    its interpreter is started with ``-I``, so no PYTHON* variable reaches Python itself)."""
    return dict(os.environ)


# Servers started before the driver has built its engine (``prestart``), waiting for the run's
# Runner to adopt them (``adopt``): the codemod server's libcst import then runs while the driver
# loads the pack and checks the base, not after.
_early: dict[str, ForkServer] = {}


def prestart(preloads: list[str]) -> None:
    """Start a server per preload ("" plain, "codemod") now; a failure to start is left for `run`
    to report, a path another user can write is refused now (exit 6)."""
    env = server_env()
    for preload in preloads:
        if preload not in _early:
            server = ForkServer(env, preload=preload)
            try:
                server.start()
            except OSError:
                continue
            _early[preload] = server


def adopt(preload: str) -> ForkServer | None:
    """The server started early for ``preload``, handed over once (None if there is none)."""
    return _early.pop(preload, None)


def close_early() -> None:
    """End the early servers no run adopted (a command that stopped before its first fix)."""
    while _early:
        _early.popitem()[1].close()


class ForkServer:
    """The driver's side: start the server on first use, send jobs, stop it at the end."""

    def __init__(self, env: dict | None = None, preload: str = ""):
        self.env = server_env() if env is None else env
        self.preload = preload  # "codemod": import libcst at start, not at the first codemod job
        self.proc: subprocess.Popen | None = None
        self.jobs = 0  # sent to the current process

    def start(self) -> None:
        """Start the server (it imports the fix machinery while the driver unwinds): an isolated
        interpreter (fixpack.sandbox.interpreter: ``-I -S``, its path explicit and checked, in
        ``/``), so that nothing another user could write runs in it or in a fix's process."""
        if self.proc is None or self.proc.poll() is not None:
            from fixpack.sandbox import interpreter

            path = interpreter.server_path()
            interpreter.refuse_untrusted(sys.path, "the driver's")
            interpreter.refuse_untrusted(path, "the fix process server's")
            self.proc = subprocess.Popen(
                interpreter.command("fixpack.sandbox.forkserver", path, [self.preload] if self.preload else []),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env, cwd=interpreter.SAFE_CWD,
            )  # fmt: skip
            self.jobs = 0

    def run(self, job: dict, timeout: float) -> dict:
        self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.jobs += 1
            self.proc.stdin.write((json.dumps(dict(job, timeout=timeout)) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise ServerDied(self._died(f"could not take the job ({exc})")) from None
        # The server kills a child at `timeout`; allow it start-up and reporting time on top.
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout + 60)
        sel.close()
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise ServerDied(self._died("gave no answer" if ready else f"did not answer within {timeout + 60:.0f} s"))
        return json.loads(line)

    def _died(self, what: str) -> str:
        proc, self.proc = self.proc, None
        assert proc is not None
        proc.kill()
        err = proc.communicate()[1].decode("utf-8", "replace").strip().splitlines()
        return f"the fix process server {what}" + (f": {err[-1]}" if err else "")

    def stop(self) -> None:
        """Tell the server to exit (end of its jobs); `close` waits for it."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def close(self) -> None:
        idle = self.jobs == 0
        self.stop()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if idle:
                # it never took a job (a run that stopped first, an already-applied tree): it has no
                # child and nothing to finish, so it is not waited for while it still imports libcst
                proc.kill()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def main(argv: list[str]) -> int:
    """The server's entry point (fixpack.sandbox.interpreter.command starts it)."""
    code = serve(*argv[:1])
    # The driver waits for this exit: skip the interpreter's teardown of every module imported
    # (libcst's take a tenth of a second); nothing is left to close but the flushed streams.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
