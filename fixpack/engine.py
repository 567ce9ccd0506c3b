"""Apply, verify and revert a selection of fixes on a tree of package folders.

The driver never edits a file it has not checked: every target must be in a pinned state
before a fix runs (pristine, or the pinned result of the fixes applied before it), and
every result must equal its pin before it is committed. Each fix is computed by its own
process (fixpack.worker) and committed all-or-nothing under a journal.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from fixpack import __version__
from fixpack.errors import BaseMismatch, ConfigError, Drift, EnvironmentFault, FixFailed
from fixpack.forkserver import ForkServer, ServerDied
from fixpack.hashing import sha256_bytes, sha256_file, short
from fixpack.lockfile import Lock, selection_key
from fixpack.pack import Fix, Pack, Port, Profile
from fixpack.paths import resolve_inside
from fixpack.store import Store, atomic_write, crashpoint, drop_bytecode, fs_error
from fixpack.verify import Lines
from fixpack.watch import TreeWatch
from fixpack.worker import SANDBOX_MODES, sealed

DEFAULT_TIMEOUT = 120.0


Reporter = Lines  # one status-line format for every command


@dataclass
class Engine:
    pack: Pack
    profile: Profile
    port: Port | None
    opt_ins: list[str]
    found: dict[str, Path]
    store: Store
    lock: Lock | None  # None: record mode (lock generation, checks), no pins
    report: Reporter = field(default_factory=Reporter)
    timeout: float = DEFAULT_TIMEOUT
    lock_wait: float = 600.0
    check_idempotent: bool = False
    # Record mode only: results of (fix, input hashes) already computed, shared across the
    # selections of one lock generation (a worker's output depends only on its inputs).
    memo: dict | None = None
    # Refuse a pack whose fixes no longer match the lock (apply); revert restores recorded
    # bytes from the backups and works on an image even while the pack is being re-locked.
    check_pack: bool = True

    def __post_init__(self):
        self.fixes: list[Fix] = self.pack.selection(self.profile, self.opt_ins, self.port)
        ordered = [e.id for e in self.profile.entries if e.opt_in and e.id in self.opt_ins]
        self.key = selection_key(self.port.name if self.port else None, ordered)
        self.files: list[str] = []
        for f in self.fixes:
            for rel in f.target_rels:
                if rel not in self.files:
                    self.files.append(rel)
        self._fix_hash = {f.id: f.content_hash() for f in self.fixes}
        self._forkserver: ForkServer | None = None
        self.sandbox = os.environ.get("FIXPACK_SANDBOX", "auto") or "auto"
        if self.sandbox not in SANDBOX_MODES:
            raise ConfigError(f"FIXPACK_SANDBOX={self.sandbox}: expected one of {', '.join(SANDBOX_MODES)}")
        self.protection: dict | None = None  # what confined the fix processes of this run
        self._watch: TreeWatch | None = None
        self._unchecked: list[str] = []  # fixes run sealed, compared at the end of the run
        self.pinned: dict | None = None
        if self.lock is not None:
            self.pinned = self.lock.selection(self.key)
            locked = [s["fix"] for s in self.pinned["steps"]]
            if not self.check_pack:
                return  # revert: the state record and the backups are all it needs
            if locked != [f.id for f in self.fixes]:
                raise ConfigError(f"{self.lock.path}: selection {self.key} pins {locked}, the pack now gives {[f.id for f in self.fixes]}; run `fixpack lock`")
            for f in self.fixes:
                want = self.lock.data["fixes"].get(f.id, {}).get("hash")
                if want != self._fix_hash[f.id]:
                    raise ConfigError(f"fix {f.id} ({f.dir}) changed since {self.lock.path.name} was generated; run `fixpack lock --profile {self.profile.name}`")

    # ---- paths and hashes
    def path(self, rel: str) -> Path:
        package, sub = rel.split("/", 1)
        if package not in self.found:
            raise BaseMismatch(f"{rel}: package {package} not found")
        return resolve_inside(self.found[package], sub, where=rel)

    def current(self, rels) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for rel in rels:
            p = self.path(rel)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                out[rel] = None
                continue
            if not stat.S_ISREG(st.st_mode):
                raise EnvironmentFault(f"{p}: expected a regular file, found {'a symlink' if stat.S_ISLNK(st.st_mode) else 'a directory' if stat.S_ISDIR(st.st_mode) else 'a special file'}; nothing was changed")
            try:
                out[rel] = sha256_file(p)
            except OSError as exc:
                raise fs_error(exc, f"cannot read {p}") from exc
        return out

    def pristine(self, rel: str) -> str | None:
        return self.lock.pristine.get(rel) if self.lock else None

    def describe(self, rel: str, h: str | None) -> str:
        if h is None:
            return "missing"
        if self.lock:
            known = self.lock.known_states(rel)
            if h in known:
                return known[h]
        return "not a state any pinned selection produces"

    def expected_after(self, steps: list[dict]) -> dict[str, str]:
        exp: dict[str, str] = {}
        for s in steps:
            for rel, (_, after) in s["files"].items():
                exp[rel] = after
        return exp

    def step_record(self, fix: Fix, files: dict[str, list[str | None]]) -> dict:
        step = {"fix": fix.id, "layer": fix.layer, "fix_hash": self._fix_hash[fix.id], "files": files}
        if fix.layer == "profile" and fix.dir != self.pack.root / "fixes" / fix.id:
            step["dir"] = fix.dir.relative_to(self.pack.root).as_posix()  # a profile's own fixes folder
        if self.protection is not None:
            step["sandbox"] = protection_text(self.protection)
        return step

    # ---- state
    def _base_state(self) -> dict:
        return {
            "profile": self.profile.name,
            "port": self.port.name if self.port else None,
            "opt_in": [e.id for e in self.profile.entries if e.opt_in and e.id in self.opt_ins],
            "key": self.key,
            "tool_version": __version__,
            "packages": {k: str(v) for k, v in self.found.items()},
            "base": {"profile_sources": self.profile.base.get("sources", {}), "found": self._identity()},
            **({"protection": dict(self.protection, detection="snapshot per run" if sealed(self.protection) else "snapshot per fix")} if self.protection else {}),
        }

    def _identity(self) -> dict:
        if not hasattr(self, "_ident"):
            from fixpack.targets import identify

            self._ident = identify(self.found)
        return self._ident

    def applied_steps(self, state: dict | None) -> list[dict]:
        """What is applied now, checked against the files. Raises on drift or a foreign base."""
        if state is not None and not state.get("__corrupt__"):
            steps = state.get("steps", [])
            exp = self.expected_after(steps)
            cur = self.current(exp)
            bad = [rel for rel in exp if cur[rel] != exp[rel]]
            if bad:
                rel = bad[0]
                raise Drift(
                    f"{rel}: the state record says it is {short(exp[rel])} (after its last fix) but it is {short(cur[rel])} "
                    f"({self.describe(rel, cur[rel])}); someone edited it. Run `fixpack verify` for details; reinstall the package or `fixpack revert --all` after restoring it"
                )
            return steps
        if state is not None:
            self.report.say(f"warning: {self.store.state_path} is corrupt; working out the applied fixes from file hashes")
        return self.infer_steps()

    def infer_steps(self) -> list[dict]:
        """No (usable) state record: find the pinned prefix the files are in."""
        if self.lock is None:
            return []
        cur = self.current(self.lock.pristine)
        if all(cur[r] == h for r, h in self.lock.pristine.items() if r in self.files):
            return []
        for sel in self.lock.data["selections"]:
            steps = sel["steps"]
            for k in range(len(steps), 0, -1):
                exp = dict(self.lock.pristine)
                exp.update(self.expected_after(steps[:k]))
                if all(cur.get(r) == h for r, h in exp.items()):
                    self.report.say(f"recovered: files match selection {sel['key']} up to {steps[k - 1]['fix']}")
                    return [dict(s, fix_hash=self.lock.data["fixes"][s["fix"]]["hash"], layer=self.lock.data["fixes"][s["fix"]].get("layer", "profile")) for s in steps[:k]]
        return []

    def check_base(self, applied: list[dict]) -> None:
        """Files of this selection that no applied fix touched must be pristine."""
        touched = set(self.expected_after(applied))
        rest = [r for r in self.files if r not in touched]
        if not rest or self.lock is None:
            return
        cur = self.current(rest)
        for rel in rest:
            want = self.pristine(rel)
            if cur[rel] != want:
                hint = "; ".join(f"{k} {' '.join(f'{a}={b}' for a, b in v.items() if a in ('version', 'commit_id', 'git_head', 'direct_url_commit'))}" for k, v in self._identity().items())
                raise BaseMismatch(
                    f"{rel}: expected the pristine {self.profile.name} file {short(want)}, found {short(cur[rel])} "
                    f"({self.describe(rel, cur[rel])}). This image is not the release the profile pins; nothing was changed"
                    + (f". Found: {hint}" if hint.strip() else "")
                )

    # ---- journal
    def recover(self) -> None:
        journal = self.store.read_journal()
        if journal is None:
            return
        if journal.get("__corrupt__"):
            raise Drift(f"{self.store.journal_path} is unreadable; inspect the files with `fixpack verify`, then remove it")
        self.report.say(f"recovering an interrupted run: {journal['op']} {journal['step']['fix']}")
        cur = self.current(journal["files"])
        for rel, (src, dst) in journal["files"].items():
            if cur[rel] == dst:
                drop_bytecode(self.path(rel))  # the kill may have come between the rename and this
                continue
            if cur[rel] != src:
                raise Drift(f"{rel}: interrupted run left {short(cur[rel])}, neither {short(src)} nor {short(dst)}")
            p = self.path(rel)
            atomic_write(p, self.store.get(dst), like=os.stat(p), label=rel)
            drop_bytecode(p)
        state = self.store.read_state()
        if not state or state.get("__corrupt__"):
            state = dict(journal["state_base"], steps=journal["steps_before"])
        steps = state.get("steps", [])
        if journal["op"] == "apply" and (not steps or steps[-1]["fix"] != journal["step"]["fix"]):
            steps.append(journal["step"])
        if journal["op"] == "unwind":
            # `revert FIX` may undo a step in the middle, not only the last one
            steps = [s for s in steps if s["fix"] != journal["step"]["fix"]]
        state["steps"] = steps
        self.store.write_state(state)
        self.store.clear_journal()

    def commit(self, op: str, step: dict, changes: dict[str, tuple[bytes, bytes]], steps_before: list[dict]) -> list[dict]:
        """Write a fix's files all-or-nothing: backups, journal, renames, state, journal gone."""
        for old, new in changes.values():
            self.store.put(old)
            self.store.put(new)
        files = {rel: [sha256_bytes(o), sha256_bytes(n)] for rel, (o, n) in changes.items()}
        base = self._base_state()
        self.store.write_journal({"op": op, "step": step, "files": files, "state_base": base, "steps_before": steps_before})
        crashpoint(f"journal written for {op} {step['fix']}")
        done: list[str] = []
        try:
            for rel, (_old, new) in changes.items():
                p = self.path(rel)
                # The target may have been swapped (directory, symlink, other bytes) since it was read.
                if self.current([rel])[rel] != files[rel][0]:
                    raise Drift(f"{rel}: changed while {step['fix']} was being committed; nothing of this fix was kept")
                try:
                    like = os.stat(p)
                except OSError as exc:
                    raise fs_error(exc, f"cannot stat {p}") from exc
                atomic_write(p, new, like=like, label=rel)
                done.append(rel)
                drop_bytecode(p)
            steps = list(steps_before)
            if op == "apply":
                steps.append(step)
            else:
                steps = [s for s in steps if s["fix"] != step["fix"]]
            self.store.write_state(dict(base, steps=steps))
        except Exception:
            self._roll_back(done, changes, files)
            raise
        crashpoint(f"state written for {op} {step['fix']}")
        self.store.clear_journal()
        if self._watch is not None and self._watch.before:
            self._watch.driver_wrote([self.path(rel) for rel in changes], self.store.dir)
        return steps

    def _roll_back(self, done: list[str], changes: dict[str, tuple[bytes, bytes]], files: dict[str, list[str]]) -> None:
        """A commit failed part-way (full disk, read-only, a swapped target): put back the files
        already renamed and drop the journal. If that fails too, the journal stays and the next
        run finishes the fix instead."""
        try:
            for rel in done:
                p = self.path(rel)
                if self.current([rel])[rel] == files[rel][1]:
                    atomic_write(p, changes[rel][0], like=os.stat(p), label=f"{rel} (roll back)")
                    drop_bytecode(p)
            self.store.clear_journal()
        except Exception as exc:  # keep the first error; the journal tells the next run what to do
            self.report.say(f"warning: could not roll back ({exc}); the next run completes the interrupted fix from {self.store.journal_path}")

    # ---- workers
    def _server(self) -> ForkServer:
        if self._forkserver is None:
            env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
            pkg_parent = str(Path(__file__).resolve().parent.parent)
            env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            self._forkserver = ForkServer(env, cwd=str(self.store.dir))
        return self._forkserver

    def close(self) -> None:
        if self._forkserver is not None:
            self._forkserver.close()
            self._forkserver = None

    def run_worker(self, fix: Fix, inputs: dict[str, Path], pins: dict | None = None, hashes: dict | None = None) -> dict[str, bytes]:
        stage = self.store.dir / "staging" / fix.id
        shutil.rmtree(stage, ignore_errors=True)
        try:
            stage.mkdir(parents=True)
        except OSError as exc:
            raise fs_error(exc, f"cannot create {stage}") from exc
        job = {
            "fix_dir": str(fix.dir),
            "kind": fix.kind,
            "stage_dir": str(stage),
            "check_idempotent": self.check_idempotent,
            "sandbox": self.sandbox,
            "targets": [
                {"rel": rel, "src": str(src), "out": str(stage / f"{i}.out")}
                for i, (rel, src) in enumerate(inputs.items())
            ],
            # An output equal to its pin was compiled when the pin was recorded; the worker need not compile it again.
            "expect": {rel: pins[rel][1] for rel in inputs} if pins else {},
        }
        watch = self._watching()
        if not watch.before:
            watch.take()
        try:
            proc = self._server().run(job, self.timeout)
        except ServerDied as exc:
            self._check_outside(fix, watch, stage)
            shutil.rmtree(stage, ignore_errors=True)
            raise FixFailed(f"{fix.id}: {exc}; nothing was written") from None
        got = self._protection_of(proc)
        if sealed(got):
            # The kernel kept this process from changing anything outside its stage; the trees
            # are compared once, at the end of the run, not after every such fix.
            self._unchecked.append(fix.id)
        else:
            self._check_outside(fix, watch, stage)
        self._note_protection(got)
        if proc["timed_out"]:
            shutil.rmtree(stage, ignore_errors=True)
            raise FixFailed(f"{fix.id}: its process did not finish within {self.timeout:.0f} s; nothing was written") from None
        try:
            lines = proc["stdout"].strip().splitlines()
            result = json.loads(lines[-1]) if lines else {}
        except ValueError:
            result = {}
        if proc["rc"] != 0 or "outputs" not in result:
            err = result.get("error") or (proc["stderr"].strip().splitlines() or ["crashed with no output"])[-1]
            if result.get("errno") in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                shutil.rmtree(stage, ignore_errors=True)
                raise fs_error(OSError(result["errno"], err), f"{fix.id}: cannot write its output in {stage}")
            tail = "\n".join(proc["stderr"].strip().splitlines()[-8:])
            shutil.rmtree(stage, ignore_errors=True)
            raise FixFailed(f"{fix.id}: {err}" + (f"\n--- its output:\n{tail}" if tail and tail not in err else "") + "\nnothing was written")
        produced = {p.name for p in stage.iterdir()}
        expected = {Path(t["out"]).name for t in job["targets"]}
        if produced - expected:
            shutil.rmtree(stage, ignore_errors=True)
            raise FixFailed(f"{fix.id}: wrote files it did not declare ({', '.join(sorted(produced - expected))}); nothing was written")
        out = {t["rel"]: Path(t["out"]).read_bytes() for t in job["targets"]}
        shutil.rmtree(stage, ignore_errors=True)
        return out

    def _watching(self) -> TreeWatch:
        """The snapshot of the package folders and the state folder that every fix's process is
        compared with. The driver keeps the files' bytes too unless the kernel confines the fixes."""
        if self._watch is None:
            kernel = False
            if self.sandbox != "hook":
                from fixpack.landlock import Unavailable, abi_version

                try:
                    abi_version()
                    kernel = True
                except Unavailable as exc:
                    if self.sandbox == "auto":
                        self.report.say(f"warning: Landlock is not available here ({exc}); each fix's process is confined by the audit hook only, "
                                        "and a snapshot of the trees before and after it finds and undoes any change outside its targets")
            roots = [*self.found.values(), self.store.dir]
            self._watch = TreeWatch(roots, skip={str(self.store.dir / "staging")}, keep_bytes=not kernel)
        return self._watch

    @staticmethod
    def _protection_of(proc: dict) -> dict | None:
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
            self.report.say(f"warning: Landlock could not confine the fix process ({got.get('reason')}); the audit hook and the snapshot check remain")
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
        lines = [f"  {c.path}: {c.what}{' (' + c.fields + ')' if c.fields else ''}; {'restored' if c.restored else 'NOT restored'} ({c.how})" for c in changed]
        raise EnvironmentFault(
            f"{changed[0].path} changed outside the fixes' targets while this run applied {', '.join(ran)}"
            + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "") + ":\n" + "\n".join(lines)
            + "\nno fix's process can have made it (each was sealed by the kernel: Landlock and the seccomp filter); "
            "another process changed the tree during the run. The fixes themselves were applied as pinned: "
            "run `fixpack verify`, and find what else writes to these packages"
        )

    def _check_outside(self, fix: Fix, watch: TreeWatch, stage: Path) -> None:
        """A fix's process may have changed nothing but its staging folder. Anything else is put
        back where the driver can, and the fix fails naming every change."""
        changed = watch.changes()
        if not changed:
            return
        shutil.rmtree(stage, ignore_errors=True)
        watch.restore(changed)
        watch.take()
        lines = [f"  {c.path}: {c.what}{' (' + c.fields + ')' if c.fields else ''}; {'restored' if c.restored else 'NOT restored'} ({c.how})" for c in changed]
        first = changed[0].path
        left = [c.path for c in changed if not c.restored]
        raise FixFailed(
            f"fix {fix.id} changed {first} outside its targets" + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "") + ":\n"
            + "\n".join(lines)
            + ("\nnothing of this fix was written; every change it made was undone" if not left else
               f"\nnothing of this fix was written, but {len(left)} change(s) could not be undone: reinstall the package that holds "
               f"{left[0]} (or restore it from the release), then run `fixpack verify`")
        )

    # ---- apply
    def fast_path_done(self) -> bool:
        """Already applied: only hashes, no lock, no worker, no libcst."""
        if self.pinned is None:
            return False
        state = self.store.read_state()
        if not state or state.get("__corrupt__") or self.store.journal_path.exists():
            return False
        steps = state.get("steps", [])
        if state.get("key") != self.key or [(s["fix"], s.get("fix_hash")) for s in steps] != [(f.id, self._fix_hash[f.id]) for f in self.fixes]:
            return False
        exp = self.expected_after(self.pinned["steps"])
        exp_state = self.expected_after(steps)
        if exp != exp_state:
            return False
        cur = self.current(exp)
        return cur == exp

    def apply(self, dry_run: bool = False) -> int:
        t0 = time.perf_counter()
        if self.fast_path_done():
            self.report.line(self.key, "ok", f"already applied: {len(self.fixes)} fixes, {len(self.files)} files match their pins ({time.perf_counter() - t0:.2f}s)")
            return 0
        if dry_run:
            state = self.store.read_state()
            applied = self.applied_steps(state) if state is not None or self.lock else []
            self.check_base(applied)
            ids = [s["fix"] for s in applied]
            pending = [f.id for f in self.fixes if f.id not in ids]
            for fid in pending:
                self.report.line(fid, "pending")
            return 1 if pending or len(ids) != len(self.fixes) else 0
        self.store.lock(self.lock_wait)
        try:
            self.recover()
            if self.fast_path_done():
                self.report.line(self.key, "ok", "already applied (by a concurrent run)")
                return 0
            state = self.store.read_state()
            applied = self.applied_steps(state)
            self.check_base(applied)
            ported = sorted({s.get("layer", "profile")[5:] for s in applied if s.get("layer", "profile").startswith("port:")})
            mine = self.port.name if self.port else None
            if ported and ported != [mine]:
                # Never drop a port's patches because a command line forgot it: the model would stop loading.
                raise ConfigError(
                    f"the image has port {', '.join(ported)} applied; name it (--port {ported[0]}) to keep it, "
                    "or remove it explicitly with `fixpack revert --all` first"
                )
            common = 0
            while (
                common < len(applied)
                and common < len(self.fixes)
                and applied[common]["fix"] == self.fixes[common].id
                and applied[common].get("fix_hash") == self._fix_hash[self.fixes[common].id]
            ):
                common += 1
            if self.fixes[common:]:
                try:
                    self._server().start()  # it imports the fix machinery while fixes are unwound
                except OSError:
                    pass  # run_worker starts it again and reports what fails
            steps = applied
            for s in reversed(applied[common:]):
                steps = self.unwind(s, steps)
            pinned_steps = {s["fix"]: s["files"] for s in self.pinned["steps"]} if self.pinned else {}
            for fix in self.fixes[common:]:
                steps = self.apply_one(fix, steps, pinned_steps.get(fix.id))
            self.check_run()
            if self.pinned is None or self.lock is None or state is None or state.get("__corrupt__"):
                # record mode, or a state record worked out from the file hashes: write it so verify agrees
                self.store.write_state(dict(self._base_state(), steps=steps))
            return 0
        finally:
            self.close()
            self.store.unlock()

    def apply_one(self, fix: Fix, steps: list[dict], pins: dict | None) -> list[dict]:
        t0 = time.perf_counter()
        rels = fix.target_rels
        if pins is not None and set(pins) != set(rels):
            raise ConfigError(f"{fix.id}: fix.yaml targets {sorted(rels)} but {self.lock.path.name if self.lock else 'the lock'} pins {sorted(pins)}; run `fixpack lock --profile {self.profile.name}`; nothing was changed")
        cur = self.current(rels)
        for rel in rels:
            if cur[rel] is None:
                raise BaseMismatch(f"{fix.id}: target {rel} does not exist in {self.found.get(rel.split('/')[0])}; nothing was changed")
            if pins is not None and cur[rel] != pins[rel][0]:
                raise BaseMismatch(
                    f"{fix.id}: {rel} is {short(cur[rel])} ({self.describe(rel, cur[rel])}), expected {short(pins[rel][0])} "
                    f"({self.describe(rel, pins[rel][0])}); nothing was changed"
                )
        inputs = {rel: self.path(rel) for rel in rels}
        old = {rel: inputs[rel].read_bytes() for rel in rels}
        if any(sha256_bytes(old[r]) != cur[r] for r in rels):
            raise Drift(f"{fix.id}: a target changed while it was being read; nothing was changed")
        key = (fix.id, self._fix_hash[fix.id], tuple(cur[r] for r in rels))
        if self.memo is not None and key in self.memo:
            new = self.memo[key]
        else:
            new = self.run_worker(fix, inputs, pins, cur)
            if self.memo is not None:
                self.memo[key] = new
        files = {rel: [cur[rel], sha256_bytes(new[rel])] for rel in rels}
        if pins is not None:
            for rel in rels:
                if files[rel][1] != pins[rel][1]:
                    raise FixFailed(f"{fix.id}: {rel} came out {short(files[rel][1])}, the pin is {short(pins[rel][1])}; nothing was written (the fix changed since the lock, or the worker misbehaved)")
        changes = {rel: (old[rel], new[rel]) for rel in rels if old[rel] != new[rel]}
        if not changes:
            raise FixFailed(f"{fix.id}: changed nothing in {', '.join(rels)}; a fix that changes nothing cannot be pinned")
        step = self.step_record(fix, files)
        steps = self.commit("apply", step, changes, steps)
        detail = "  ".join(f"{rel.split('/')[-1]} {short(b)[:8]}>{short(a)[:8]}" for rel, (b, a) in files.items())
        self.report.line(fix.id, "applied", f"{detail}  {time.perf_counter() - t0:.2f}s", files=files, seconds=round(time.perf_counter() - t0, 3))
        return steps

    def unwind(self, step: dict, steps: list[dict]) -> list[dict]:
        changes = {}
        cur = self.current(step["files"])
        for rel, (before, after) in step["files"].items():
            if cur[rel] != after:
                raise Drift(f"{rel}: cannot undo {step['fix']}: the file is {short(cur[rel])}, not its result {short(after)}")
            changes[rel] = (self.path(rel).read_bytes(), self.store.get(before))
        steps = self.commit("unwind", step, changes, steps)
        self.report.line(step["fix"], "reverted", ", ".join(step["files"]))
        return steps


def protection_text(p: dict) -> str:
    if sealed(p):
        return f"landlock ABI {p.get('abi')} + seccomp + audit hook + snapshot per run"
    if p.get("sandbox") == "landlock":
        why = f"; no seccomp filter: {p['seccomp_reason']}" if p.get("seccomp_reason") else ""
        return f"landlock ABI {p.get('abi')} + audit hook + snapshot per fix{why}"
    return f"audit hook + snapshot (no Landlock: {p.get('reason', 'unknown')})"


def revert(engine: Engine, fix_id: str | None) -> int:
    """Undo one applied fix (no later fix may touch its files) or all of them, exactly."""
    engine.store.lock(engine.lock_wait)
    try:
        engine.recover()
        state = engine.store.read_state()
        steps = engine.applied_steps(state)
        if not steps:
            engine.report.say("nothing applied; nothing to revert")
            return 0
        if fix_id is None:
            for s in reversed(list(steps)):
                steps = engine.unwind(s, steps)
            return 0
        ids = [s["fix"] for s in steps]
        if fix_id not in ids:
            raise ConfigError(f"{fix_id} is not applied (applied: {', '.join(ids)})")
        i = ids.index(fix_id)
        mine = set(steps[i]["files"])
        later = [s["fix"] for s in steps[i + 1 :] if mine & set(s["files"])]
        if later:
            raise ConfigError(f"{fix_id}: later fix(es) {', '.join(later)} change the same file(s); revert them first, or use --all")
        engine.unwind(steps[i], steps)
        return 0
    finally:
        engine.store.unlock()
