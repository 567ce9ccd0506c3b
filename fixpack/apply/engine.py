"""The driver: apply, verify and revert a selection of fixes on a tree of package folders.

The driver never edits a file it has not checked: every target must be in a pinned state
before a fix runs (pristine, or the pinned result of the fixes applied before it), and
every result must equal its pin before it is committed. Each fix is computed by its own
process (fixpack.sandbox.runner) and committed all-or-nothing under a journal (fixpack.apply.journal).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from fixpack import __version__
from fixpack.apply import dirfd, journal
from fixpack.apply.hashing import sha256_bytes, short
from fixpack.apply.state import Journal, Layer, StateRecord, Step, Unreadable, expected_after, pinned_steps
from fixpack.apply.store import Store, fs_error
from fixpack.cli.output import Lines, printable
from fixpack.errors import BaseMismatch, ConfigError, Drift, EnvironmentFault, FixFailed
from fixpack.pack.lockfile import Lock, selection_key
from fixpack.pack.pack import Fix, Pack, Port, Profile
from fixpack.pack.paths import resolve_inside
from fixpack.sandbox.runner import DEFAULT_TIMEOUT, Runner, protection_text
from fixpack.sandbox.worker import sealed

__all__ = ["DEFAULT_TIMEOUT", "Engine", "protection_text", "revert"]


@dataclass
class Engine:
    pack: Pack
    profile: Profile
    port: Port | None
    opt_ins: list[str]
    found: dict[str, Path]
    store: Store
    lock: Lock | None  # None: record mode (lock generation, checks), no pins
    report: Lines = field(default_factory=Lines)
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
        self.runner = Runner(
            list(self.found.values()),
            self.store.dir,
            self.report,
            timeout=self.timeout,
            check_idempotent=self.check_idempotent,
            store=self.store,
        )
        self.pinned: list[Step] | None = None  # the lock's steps for this selection
        if self.lock is not None:
            self.pinned = [Step.from_json(s) for s in self.lock.selection(self.key)["steps"]]
            locked = [s.fix for s in self.pinned]
            if not self.check_pack:
                return  # revert: the state record and the backups are all it needs
            if locked != [f.id for f in self.fixes]:
                raise ConfigError(
                    f"{self.lock.path}: selection {self.key} pins {locked}, the pack now gives {[f.id for f in self.fixes]}; run `fixpack lock`"
                )
            for f in self.fixes:
                want = self.lock.data["fixes"].get(f.id, {}).get("hash")
                if want != self._fix_hash[f.id]:
                    raise ConfigError(
                        f"fix {f.id} ({f.dir}) changed since {self.lock.path.name} was generated; run `fixpack lock --profile {self.profile.name}`"
                    )

    @property
    def protection(self) -> dict | None:
        """What confined the fix processes of this run (None before the first)."""
        return self.runner.protection

    # ---- paths and hashes
    def path(self, rel: str) -> Path:
        package, sub = rel.split("/", 1)
        if package not in self.found:
            raise BaseMismatch(f"{rel}: package {package} not found")
        return resolve_inside(self.found[package], sub, where=rel)

    def root(self, rel: str) -> Path:
        """The package folder ``rel`` is in: where writes to it are walked from (fixpack.apply.dirfd)."""
        package = rel.split("/", 1)[0]
        if package not in self.found:
            raise BaseMismatch(f"{rel}: package {package} not found")
        return self.found[package]

    def current(self, rels) -> dict[str, str | None]:
        """Each target's sha256 (None: missing)."""
        return _hashes(self.contents(rels))

    def contents(self, rels) -> dict[str, bytes | None]:
        """Each target's bytes (None: missing), each read once, through its folder's descriptor
        walked from its package folder (fixpack.apply.dirfd.read_under: no symlink followed on the
        way or at its name, never blocking, at most `dirfd.READ_BOUND` bytes); anything but a
        regular file is refused (exit 6)."""
        out: dict[str, bytes | None] = {}
        for rel in rels:
            p = self.path(rel)
            try:
                out[rel] = dirfd.read_under(str(self.root(rel)), str(p))
            except FileNotFoundError:
                out[rel] = None
            except dirfd.NotRegular as exc:
                raise EnvironmentFault(
                    f"{p}: expected a regular file, found {exc.what.split(',')[0]}; nothing was changed"
                ) from None
            except dirfd.ParentReplaced as exc:  # nothing is read, nor written, through it
                raise dirfd.ParentReplaced(str(p), exc.detail, done="written") from None
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

    def step_record(self, fix: Fix, files: dict[str, list[str]]) -> Step:
        step = Step(fix=fix.id, files=files, layer=Layer.parse(fix.layer), fix_hash=self._fix_hash[fix.id])
        if self.protection is not None:
            step.sandbox = protection_text(self.protection)
        return step

    # ---- state
    def _base_state(self) -> StateRecord:
        prot = self.protection
        return StateRecord(
            profile=self.profile.name,
            port=self.port.name if self.port else None,
            opt_in=[e.id for e in self.profile.entries if e.opt_in and e.id in self.opt_ins],
            key=self.key,
            tool_version=__version__,
            packages={k: str(v) for k, v in self.found.items()},
            base={"profile_sources": self.profile.base.get("sources", {}), "found": self._identity()},
            protection=dict(prot, detection="snapshot per run" if sealed(prot) else "snapshot per fix")
            if prot
            else None,
        )

    def _identity(self) -> dict:
        if not hasattr(self, "_ident"):
            from fixpack.apply.targets import identify

            self._ident = identify(self.found)
        return self._ident

    def applied_steps(self, state: StateRecord | Unreadable | None) -> list[Step]:
        """What is applied now, checked against the lock's pins and the files. Raises on drift
        or a foreign base."""
        if isinstance(state, StateRecord):
            steps = state.steps
            if self.lock is not None:
                pinned_steps(self.lock, state.key, steps, self.store.state_path)
            exp = expected_after(steps)
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
            self.report.say(
                f"warning: {self.store.state_path} is corrupt; working out the applied fixes from file hashes"
            )
        return self.infer_steps()

    def infer_steps(self) -> list[Step]:
        """No (usable) state record: find the pinned prefix the files are in."""
        if self.lock is None:
            return []
        cur = self.current(self.lock.pristine)
        if all(cur[r] == h for r, h in self.lock.pristine.items() if r in self.files):
            return []
        fixes = self.lock.data["fixes"]
        for sel in self.lock.data["selections"]:
            steps = [Step.from_json(s) for s in sel["steps"]]
            for k in range(len(steps), 0, -1):
                exp = dict(self.lock.pristine)
                exp.update(expected_after(steps[:k]))
                if all(cur.get(r) == h for r, h in exp.items()):
                    self.report.say(f"recovered: files match selection {sel['key']} up to {steps[k - 1].fix}")
                    for s in steps[:k]:
                        s.fix_hash, s.layer = fixes[s.fix]["hash"], Layer.parse(fixes[s.fix].get("layer", "profile"))
                    return steps[:k]
        return []

    def check_base(self, applied: list[Step]) -> None:
        """Files of this selection that no applied fix touched must be pristine."""
        touched = set(expected_after(applied))
        rest = [r for r in self.files if r not in touched]
        if not rest or self.lock is None:
            return
        cur = self.current(rest)
        for rel in rest:
            want = self.pristine(rel)
            if cur[rel] != want:
                # from the packages' own version files, which their owner writes: escaped when printed
                hint = "; ".join(
                    f"{k} {' '.join(f'{a}={b}' for a, b in v.items() if a in ('version', 'commit_id', 'git_head', 'direct_url_commit'))}"
                    for k, v in self._identity().items()
                )
                raise BaseMismatch(
                    f"{rel}: expected the pristine {self.profile.name} file {short(want)}, found {short(cur[rel])} "
                    f"({self.describe(rel, cur[rel])}). This image is not the release the profile pins; nothing was changed"
                    + (f". Found: {printable(hint)}" if hint.strip() else "")
                )

    # ---- journal
    def recover(self) -> None:
        journal.recover(self.store, self, self.report, None if self.lock is None else self._check_journal)

    def _check_journal(self, j: Journal) -> None:
        """A journal is finished only when every state it names is one the lock pins for its fix
        in the selection it was committing: else a planted journal would launder its bytes."""
        assert self.lock is not None
        where = self.store.journal_path
        key = j.state_base.key
        pins = pinned_steps(self.lock, key, [*j.steps_before, j.step], where)
        want = pins[j.step.fix]
        for rel, pair in j.files.items():
            exp = want.get(rel) if j.op == "apply" else list(reversed(want.get(rel) or []))
            if j.op not in ("apply", "unwind") or list(pair) != exp:
                raise Drift(
                    f"{where}: {j.op} {j.step.fix} records {rel} as {short(pair[0])} -> {short(pair[1])}, which {self.lock.path.name} "
                    f"does not pin for selection {key}; the journal is not trusted and nothing was recovered from it. "
                    "Run `fixpack verify`; restore the file (reinstall its package), then remove the journal"
                )

    def commit(
        self, op: str, step: Step, changes: dict[str, tuple[bytes, bytes]], steps_before: list[Step]
    ) -> list[Step]:
        steps = journal.commit(self.store, self, op, step, changes, steps_before, self._base_state(), self.report)
        self.runner.driver_wrote([self.path(rel) for rel in changes])
        return steps

    # ---- fix processes
    def run_worker(
        self, fix: Fix, inputs: dict[str, bytes], pins: dict | None = None, hashes: dict | None = None
    ) -> dict[str, bytes]:
        """The fix's outputs from ``inputs``: the bytes the driver read and hashed (never read again)."""
        # the timeout as it is now: `fixpack apply --timeout` sets it after the engine is built;
        # with a lock, where it recorded this fix's definitions (a pinned module is not parsed again)
        known = (self.lock.data.get("definitions") or {}).get(fix.id) if self.lock is not None else None
        return self.runner.run(fix, inputs, pins, hashes, timeout=self.timeout, known=known)

    def check_run(self) -> None:
        self.runner.check_run()

    def close(self) -> None:
        self.runner.close()

    # ---- apply
    def same_fix(self, step: Step) -> bool:
        """Whether an applied step is the fix as the pack has it now: the same hash, or (with a
        lock) an earlier hash the lock keeps for it because its pinned files did not change."""
        if step.fix_hash == self._fix_hash.get(step.fix):
            return True
        if self.lock is None or self.pinned is None:
            return False
        from fixpack.apply.fastpath import hash_known

        pins = {s.fix: s.files for s in self.pinned}
        return hash_known(self.lock.data["fixes"].get(step.fix, {}), step.fix_hash) and pins.get(step.fix) == step.files

    def fast_path_done(self) -> bool:
        """Already applied: only hashes, no lock, no worker, no libcst."""
        if self.pinned is None:
            return False
        state = self.store.read_state()
        if not isinstance(state, StateRecord) or self.store.has_journal():
            return False
        steps = state.steps
        if state.key != self.key or [s.fix for s in steps] != [f.id for f in self.fixes]:
            return False
        if not all(self.same_fix(s) for s in steps):
            return False
        if [s.files for s in steps] != [s.files for s in self.pinned]:
            return False  # a record the lock does not pin: the full path names it as drift
        exp = expected_after(self.pinned)
        exp_state = expected_after(steps)
        if exp != exp_state:
            return False
        cur = self.current(exp)
        return cur == exp

    def apply(self, dry_run: bool = False) -> int:
        t0 = time.perf_counter()
        if self.fast_path_done():
            self.report.line(
                self.key,
                "ok",
                f"already applied: {len(self.fixes)} fixes, {len(self.files)} files match their pins ({time.perf_counter() - t0:.2f}s)",
            )
            return 0
        if dry_run:
            state = self.store.read_state()
            applied = self.applied_steps(state) if state is not None or self.lock else []
            self.check_base(applied)
            ids = [s.fix for s in applied]
            pending = [f.id for f in self.fixes if f.id not in ids]
            for fid in pending:
                self.report.line(fid, "pending")
            return 1 if pending or len(ids) != len(self.fixes) else 0
        self.store.lock(self.lock_wait)
        try:
            # the fork servers import the fix machinery (libcst too, for codemods) while the
            # driver checks the base; a run that stops before its first fix just closes them
            self.runner.start({f.kind for f in self.fixes})
            self.recover()
            if self.fast_path_done():
                self.report.line(self.key, "ok", "already applied (by a concurrent run)")
                return 0
            state = self.store.read_state()
            applied = self.applied_steps(state)
            self.check_base(applied)
            ported = sorted({s.layer.port for s in applied if s.layer.port})
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
                and applied[common].fix == self.fixes[common].id
                and self.same_fix(applied[common])
            ):
                common += 1
            steps = applied
            for s in reversed(applied[common:]):
                steps = self.unwind(s, steps)
            pinned_steps = {s.fix: s.files for s in self.pinned} if self.pinned else {}
            for fix in self.fixes[common:]:
                steps = self.apply_one(fix, steps, pinned_steps.get(fix.id))
            self.check_run()
            if self.pinned is None or self.lock is None or not isinstance(state, StateRecord):
                # record mode, or a state record worked out from the file hashes: write it so verify agrees
                self.store.write_state(self._base_state().with_steps(steps))
            return 0
        finally:
            self.close()
            self.store.unlock()

    def apply_one(self, fix: Fix, steps: list[Step], pins: dict | None) -> list[Step]:
        t0 = time.perf_counter()
        rels = fix.target_rels
        if pins is not None and set(pins) != set(rels):
            raise ConfigError(
                f"{fix.id}: fix.yaml targets {sorted(rels)} but {self.lock.path.name if self.lock else 'the lock'} pins {sorted(pins)}; run `fixpack lock --profile {self.profile.name}`; nothing was changed"
            )
        # the bytes the fix gets are the bytes hashed and checked against the pins
        read = self.contents(rels)
        cur = _hashes(read)
        for rel in rels:
            if cur[rel] is None:
                raise BaseMismatch(
                    f"{fix.id}: target {rel} does not exist in {self.found.get(rel.split('/')[0])}; nothing was changed"
                )
            if pins is not None and cur[rel] != pins[rel][0]:
                raise BaseMismatch(
                    f"{fix.id}: {rel} is {short(cur[rel])} ({self.describe(rel, cur[rel])}), expected {short(pins[rel][0])} "
                    f"({self.describe(rel, pins[rel][0])}); nothing was changed"
                )
        old = {rel: data for rel, data in read.items() if data is not None}
        key = (fix.id, self._fix_hash[fix.id], tuple(cur[r] for r in rels))
        if self.memo is not None and key in self.memo:
            new = self.memo[key]
        else:
            new = self.run_worker(fix, old, pins, cur)
            if self.memo is not None:
                self.memo[key] = new
        files = {rel: [str(cur[rel]), sha256_bytes(new[rel])] for rel in rels}
        if pins is not None:
            for rel in rels:
                if files[rel][1] != pins[rel][1]:
                    raise FixFailed(
                        f"{fix.id}: {rel} came out {short(files[rel][1])}, the pin is {short(pins[rel][1])}; nothing was written (the fix changed since the lock, or the worker misbehaved)"
                    )
        changes = {rel: (old[rel], new[rel]) for rel in rels if old[rel] != new[rel]}
        if not changes:
            raise FixFailed(
                f"{fix.id}: changed nothing in {', '.join(rels)}; a fix that changes nothing cannot be pinned"
            )
        step = self.step_record(fix, files)
        steps = self.commit("apply", step, changes, steps)
        detail = "  ".join(f"{rel.split('/')[-1]} {short(b)[:8]}>{short(a)[:8]}" for rel, (b, a) in files.items())
        self.report.line(
            fix.id,
            "applied",
            f"{detail}  {time.perf_counter() - t0:.2f}s",
            files=files,
            seconds=round(time.perf_counter() - t0, 3),
        )
        return steps

    def unwind(self, step: Step, steps: list[Step]) -> list[Step]:
        changes = {}
        read = self.contents(step.files)  # read once: the bytes checked are the bytes kept as the backup
        cur = _hashes(read)
        for rel, (before, after) in step.files.items():
            data = read[rel]
            if data is None or cur[rel] != after:
                raise Drift(
                    f"{rel}: cannot undo {step.fix}: the file is {short(cur[rel])}, not its result {short(after)}"
                )
            changes[rel] = (data, self.store.get(before))
        steps = self.commit("unwind", step, changes, steps)
        self.report.line(step.fix, "reverted", ", ".join(step.files))
        return steps


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
        ids = [s.fix for s in steps]
        if fix_id not in ids:
            raise ConfigError(f"{fix_id} is not applied (applied: {', '.join(ids)})")
        i = ids.index(fix_id)
        mine = set(steps[i].files)
        later = [s.fix for s in steps[i + 1 :] if mine & set(s.files)]
        if later:
            raise ConfigError(
                f"{fix_id}: later fix(es) {', '.join(later)} change the same file(s); revert them first, or use --all"
            )
        engine.unwind(steps[i], steps)
        return 0
    finally:
        engine.store.unlock()


def _hashes(contents: dict[str, bytes | None]) -> dict[str, str | None]:
    return {rel: None if data is None else sha256_bytes(data) for rel, data in contents.items()}
