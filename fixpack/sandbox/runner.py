"""The runner: one fix's job in, the bytes of its targets out.

Each fix is computed by its own process (fixpack.sandbox.worker, forked by fixpack.sandbox.forkserver),
confined where the kernel can (Landlock, the seccomp filter) and by an audit hook. The runner
snapshots the package folders and the state folder around it (fixpack.sandbox.watch): a change outside
the fix's stage is undone and fails the fix, or, for a process the kernel sealed, is looked for
once at the end of the run (`check_run`). It writes nothing but the stage; the driver
(fixpack.apply.engine) checks the bytes against the pins and the journal (fixpack.apply.journal) commits them.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from fixpack import kinds
from fixpack.apply import dirfd
from fixpack.apply.store import Store, fs_error
from fixpack.cli.output import Lines, printable
from fixpack.errors import ConfigError, EnvironmentFault, FixFailed
from fixpack.pack.pack import Fix
from fixpack.sandbox import forkserver
from fixpack.sandbox import limits as rlimits
from fixpack.sandbox.forkserver import ForkServer, ServerDied
from fixpack.sandbox.watch import TreeWatch
from fixpack.sandbox.worker import SANDBOX_MODES, sealed

DEFAULT_TIMEOUT = 120.0


class Runner:
    """Runs fixes' jobs for one driver run; `close` ends its fork server."""

    def __init__(
        self,
        roots: list[Path],
        state_dir: Path,
        report: Lines,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        check_idempotent: bool = False,
        store: Store | None = None,
    ):
        self.roots = roots  # the package folders the fixes' targets are in
        self.store = store or Store(state_dir)  # the state folder, opened once: the stages are made through it
        self.state_dir = state_dir
        self.report = report
        self.timeout = timeout
        self.check_idempotent = check_idempotent
        self.sandbox = os.environ.get("FIXPACK_SANDBOX", "auto") or "auto"
        if self.sandbox not in SANDBOX_MODES:
            raise ConfigError(f"FIXPACK_SANDBOX={self.sandbox}: expected one of {', '.join(SANDBOX_MODES)}")
        self.limits = rlimits.parse(os.environ.get("FIXPACK_LIMITS"))  # per fix's process; ConfigError if malformed
        self.protection: dict | None = None  # what confined the fix processes of this run
        self._forkservers: dict[str, ForkServer] = {}  # "" for diffs and edits, "codemod" for codemods
        self._watch: TreeWatch | None = None
        self._unchecked: list[str] = []  # fixes run sealed, compared at the end of the run
        # {fix: {sha256 of a text: {qualname: [first, last]}}}: where each fix's process found
        # the definitions it names (fixpack.kinds.edit.locate), for the lock to keep
        self.located: dict[str, dict[str, dict[str, list[int]]]] = {}

    # ---- the fork server
    def _server(self, kind: str) -> ForkServer:
        """The fork server for a fix of ``kind``: codemods have their own, which imports libcst
        when it starts, so that the import runs beside the fixes before the first codemod."""
        preload = kinds.kind(kind).server
        if preload not in self._forkservers:
            early = forkserver.adopt(preload)  # started by the command before the engine was built
            self._forkservers[preload] = early or ForkServer(forkserver.server_env(), preload=preload)
        return self._forkservers[preload]

    def start(self, kind_names: set[str]) -> None:
        """Start the fork servers the fixes of these kinds need now (they import the fix
        machinery while the driver works)."""
        for kind in sorted(kind_names):
            try:
                self._server(kind).start()
            except OSError:
                pass  # `run` starts it again and reports what fails

    def close(self) -> None:
        servers, self._forkservers = self._forkservers, {}
        for server in servers.values():
            server.stop()  # both exit at once, then both are waited for
        for server in servers.values():
            server.close()

    # ---- one fix
    def run(
        self,
        fix: Fix,
        inputs: dict[str, bytes],
        pins: dict | None = None,
        hashes: dict | None = None,
        *,
        timeout: float | None = None,
        known: dict | None = None,
    ) -> dict[str, bytes]:
        """The new bytes of each of ``fix``'s targets from ``inputs`` (rel -> the bytes the driver
        read and hashed: handed on as they are, never read again); ``pins`` (rel -> [before,
        after]) let the worker skip compiling an output equal to its pin; ``timeout`` (seconds)
        replaces the runner's own for this fix; ``known``: the lock's record of where the fix's
        definitions sit in its pinned texts (fixpack.kinds.edit.locate)."""
        timeout = self.timeout if timeout is None else timeout
        stage = self.store.stage(fix.id)  # through the state folder's descriptor (fixpack.apply.store)
        try:
            return self._run_in(fix, stage, inputs, pins, timeout, known)
        finally:
            # whatever its process left there, at any depth (fixpack.apply.dirfd.remove_tree_at)
            self.store.drop_stage(fix.id)

    def _run_in(
        self, fix: Fix, stage: Path, inputs: dict[str, bytes], pins: dict | None, timeout: float, known: dict | None
    ) -> dict[str, bytes]:
        # The fix's process holds no capability (fixpack.sandbox.privilege): a target it could not read
        # itself (another owner's, mode 0600) is read by the driver and handed over as a copy in its stage.
        sfd = self.store.open_stage(fix.id)
        try:
            for i, data in enumerate(inputs.values()):
                try:
                    dirfd.create_at(sfd, f"{i}.in", data)
                except OSError as exc:
                    raise fs_error(
                        exc, f"{fix.id}: cannot hand its input to its process through {stage / f'{i}.in'}"
                    ) from exc
        finally:
            os.close(sfd)
        job: dict[str, Any] = {
            "fix_dir": str(fix.change_dir),  # the folder of this release's change file
            "kind": fix.kind,
            "stage_dir": str(stage),
            "check_idempotent": self.check_idempotent,
            "sandbox": self.sandbox,
            "limits": self.limits,
            "targets": [
                {"rel": rel, "src": str(stage / f"{i}.in"), "out": str(stage / f"{i}.out")}
                for i, rel in enumerate(inputs)
            ],
            # An output equal to its pin was compiled when the pin was recorded; the worker need not compile it again.
            "expect": {rel: pins[rel][1] for rel in inputs} if pins else {},
            "definitions": known or {},
        }
        watch = self._watching()
        if not watch.before:
            watch.take()
        try:
            proc = self._server(fix.kind).run(job, timeout)
        except ServerDied as exc:
            self._check_outside(fix, watch)
            raise FixFailed(f"{fix.id}: {printable(str(exc))}; nothing was written") from None
        # the stage's path led into the state folder when the process was confined to it; if
        # the folder was swapped since, its outputs are not read from wherever it leads now
        self.store.check_folder()
        got = self.protection_of(proc)
        if sealed(got):
            # The kernel kept this process from changing anything outside its stage; the trees
            # are compared once, at the end of the run, not after every such fix.
            self._unchecked.append(fix.id)
        else:
            self._check_outside(fix, watch)
        self._note_protection(got)
        if proc["timed_out"]:
            raise FixFailed(
                f"{fix.id}: its process did not finish within {timeout:.0f} s; nothing was written"
            ) from None
        try:
            lines = proc["stdout"].strip().splitlines()
            result = json.loads(lines[-1]) if lines else {}
        except ValueError:
            result = {}
        if not isinstance(result, dict):
            result = {}
        used = proc.get("usage") or {}
        if used.get("killed"):
            self.report.say(
                f"warning: fix {fix.id} left {used['killed']} process(es) running after its own ended; they were killed before the tree was compared"
            )
        if proc["rc"] != 0 or "outputs" not in result:
            # split at newlines only: a carriage return or another break of its stays, escaped
            said = proc["stderr"].strip().split("\n") if proc["stderr"].strip() else []
            err = _fix_text(str(result.get("error") or (said or ["crashed with no output"])[-1]))
            over = rlimits.exceeded(
                self.limits,
                error=str(result.get("error") or ""),
                errno_=result.get("errno"),
                signal_=-proc["rc"] if isinstance(proc["rc"], int) and proc["rc"] < 0 else None,
                cpu_s=float(used.get("cpu_s") or 0),
            )
            if over:
                raise FixFailed(f"fix {fix.id} exceeded the {over}: {err}; nothing was written")
            if result.get("errno") in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise fs_error(OSError(result["errno"], err), f"{fix.id}: cannot write its output in {stage}")
            last = said[-8:]
            tail = printable("\n".join(last), lines=True) if last else ""
            raise FixFailed(
                f"{fix.id}: {err}"
                + (f"\n--- its output:\n{tail}" if last and _fix_text(last[-1]) != err else "")
                + "\nnothing was written"
            )
        expected = {Path(t["out"]).name for t in job["targets"]} | {Path(t["src"]).name for t in job["targets"]}
        out: dict[str, bytes] = {}
        sfd = self.store.open_stage(fix.id)
        try:
            extra = _undeclared(sfd, expected)
            if extra:
                raise FixFailed(f"{fix.id}: wrote files it did not declare ({extra}); nothing was written")
            for t in job["targets"]:
                # through the stage's descriptor, no symlink followed, never blocking, bounded
                # (fixpack.apply.dirfd.read_at): a symlink to a FIFO or to /dev/zero, a folder or
                # a huge file in its place is the fix's failure, named
                name = Path(t["out"]).name
                try:
                    out[t["rel"]] = dirfd.read_at(sfd, name, limit=dirfd.READ_BOUND, path=t["out"])
                except FileNotFoundError:
                    raise FixFailed(
                        f"{fix.id}: its process did not write {t['out']} ({t['rel']}); nothing was written"
                    ) from None
                except dirfd.NotRegular as exc:
                    raise FixFailed(
                        f"{fix.id}: its output for {t['rel']}, {printable(str(exc))}; nothing was written"
                    ) from None
                except OSError as exc:
                    raise fs_error(exc, f"{fix.id}: cannot read its output {t['out']}") from exc
        finally:
            os.close(sfd)
        self._note_located(fix, result.get("located"))
        return out

    def _note_located(self, fix: Fix, located) -> None:
        """Keep what the fix's process says it located, in the shape the lock stores; anything
        else is ignored (a record is only ever used for the same fix, checked by its hash)."""
        if not isinstance(located, dict):
            return
        mine = self.located.setdefault(fix.id, {})
        for digest, spans in located.items():
            if not (isinstance(digest, str) and isinstance(spans, dict)):
                continue
            for qualname, span in spans.items():
                if isinstance(span, list) and len(span) == 2 and all(isinstance(n, int) for n in span):
                    mine.setdefault(digest, {})[qualname] = span

    # ---- the snapshot check
    def _watching(self) -> TreeWatch:
        """The snapshot of the package folders and the state folder that every fix's process is
        compared with. The driver keeps the files' bytes too unless the kernel confines the fixes."""
        if self._watch is None:
            kernel = False
            if self.sandbox != "hook":
                from fixpack.sandbox.landlock import Unavailable, abi_version

                try:
                    abi_version()
                    kernel = True
                except Unavailable as exc:
                    if self.sandbox == "auto":
                        self.report.say(
                            f"warning: Landlock is not available here ({exc}); each fix's process is confined by the audit hook only, "
                            "and a snapshot of the trees before and after it finds and undoes any change outside its targets"
                        )
            roots = [*self.roots, self.state_dir]
            self._watch = TreeWatch(roots, skip={str(self.state_dir / "staging")}, keep_bytes=not kernel)
        return self._watch

    def driver_wrote(self, paths: list[Path]) -> None:
        """The driver changed these files itself: the snapshot takes them as they are now."""
        if self._watch is not None and self._watch.before:
            self._watch.driver_wrote(paths, self.state_dir)

    @staticmethod
    def protection_of(proc: dict) -> dict | None:
        """What confined the fix's process, from the first line it printed (written before the
        fix was loaded, so the fix cannot have forged it); None when it printed none."""
        lines = proc.get("stdout", "").strip().splitlines()
        try:
            got = json.loads(lines[0]).get("protection") if lines else None
        except (ValueError, AttributeError):
            got = None
        return got if isinstance(got, dict) else None

    def _note_protection(self, got: dict | None) -> None:
        if got is None:
            return
        if got.get("sandbox") != "landlock" and self._watch is not None and not self._watch.keep_bytes:
            self.report.say(
                f"warning: Landlock could not confine the fix process ({got.get('reason')}); the audit hook and the snapshot check remain"
            )
            self._watch.start_keeping_bytes()
        if self.protection is None:
            self.protection = got

    def check_run(self) -> None:
        """The one comparison for the fixes whose processes the kernel sealed: nothing of theirs
        can show here, so a change found is another process's, made while this run went on."""
        ran, self._unchecked = self._unchecked, []
        if not ran or self._watch is None:
            return
        changed = self._watch.changes()
        if not changed:
            return
        self._watch.restore(changed)
        self._watch.take()
        lines = [f"  {c.line()}" for c in changed]
        swapped = "".join(c.line() + "\n" for c in changed if c.replaced)
        raise EnvironmentFault(
            swapped
            + f"{printable(changed[0].path)} changed outside the fixes' targets while this run applied {', '.join(ran)}"
            + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")
            + ":\n"
            + "\n".join(lines)
            + "\nno fix's process can have made it (each was sealed by the kernel: Landlock and the seccomp filter); "
            "another process changed the tree during the run. The fixes themselves were applied as pinned: "
            "run `fixpack verify`, and find what else writes to these packages"
        )

    def _check_outside(self, fix: Fix, watch: TreeWatch) -> None:
        """A fix's process may have changed nothing but its staging folder. Anything else is put
        back where the driver can, and the fix fails naming every change."""
        try:
            changed = watch.changes()
        except dirfd.BoundExceeded as exc:
            # more entries than a scan takes: what changed is not known, so nothing is put back
            raise FixFailed(
                f"fix {fix.id}: after its process ended (not sealed by the kernel: it, or another process, may have "
                f"made it so), {exc}. Nothing of this fix was written; reinstall the package, then run `fixpack verify`"
            ) from None
        if not changed:
            return
        watch.restore(changed)
        watch.take()
        lines = [f"  {c.line()}" for c in changed]
        swapped = [c for c in changed if c.replaced]
        if swapped:
            # a folder of the tree was swapped (for a symlink, say) during the run: refused, never
            # written through; the fix's process is blamed because it was not sealed, and it
            # may have been another process (without the kernel's seal, fixpack cannot tell)
            raise EnvironmentFault(
                "\n".join(c.line() for c in swapped)
                + f"\nwhile fix {fix.id} ran (its process, or another process: it was not sealed by the kernel), the tree changed outside its targets:\n"
                + "\n".join(lines)
                + "\nnothing of this fix was written. Find what replaced the folder, restore the package (reinstall it), then run `fixpack verify`"
            )
        first = printable(changed[0].path)
        left = [c.path for c in changed if not c.restored]
        raise FixFailed(
            f"fix {fix.id} changed {first} outside its targets"
            + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")
            + ":\n"
            + "\n".join(lines)
            + (
                "\nnothing of this fix was written; every change it made was undone"
                if not left
                else f"\nnothing of this fix was written, but {len(left)} change(s) could not be undone: reinstall the package that holds "
                f"{printable(left[0])} (or restore it from the release), then run `fixpack verify`"
            )
        )


def protection_text(p: dict) -> str:
    # what was dropped and filtered in every mode (absent from records written before 0.2.0)
    extra = "; no capabilities" if p.get("capabilities") == "none" else ""
    if p.get("syscall_filter"):
        extra += (
            f"; privileged-call filter: {p['syscall_filter']}"
            if p["syscall_filter"].startswith("none")
            else "; privileged-call filter"
        )
    if sealed(p):
        return f"landlock ABI {p.get('abi')} + seccomp + audit hook + snapshot per run{extra}"
    if p.get("sandbox") == "landlock":
        why = f"; no seccomp filter: {p['seccomp_reason']}" if p.get("seccomp_reason") else ""
        return f"landlock ABI {p.get('abi')} + audit hook + snapshot per fix{why}{extra}"
    return f"audit hook + snapshot (no Landlock: {p.get('reason', 'unknown')}){extra}"


def _fix_text(text: str) -> str:
    """A fix's error for a message: its first line escaped in place, any further lines as an
    indented block (fixpack.cli.output.printable)."""
    first, _, rest = text.partition("\n")
    return printable(first) + ("\n" + printable(rest, lines=True) if rest else "")


UNDECLARED_SHOWN = 10  # names of undeclared entries a message lists; the rest are counted


def _undeclared(stage_fd: int, expected: set[str]) -> str:
    """The entries of the stage other than ``expected``, for a message (the first few, escaped,
    and how many more): the listing is streamed, never held whole."""
    names: list[str] = []
    more = 0
    with os.scandir(stage_fd) as it:
        for entry in it:
            if entry.name in expected:
                continue
            if len(names) < UNDECLARED_SHOWN:
                names.append(printable(entry.name))
            else:
                more += 1
    return ", ".join(sorted(names)) + (f" and {more} more" if more else "")
