"""The release check: prove every fix against the pristine release sources.

For each fix, in pack order, on a scratch tree of the release: it applies and gives its
pinned hashes; its output compiles (and a codemod is a fixed point of itself). Then, part by
part (fixpack/proofs/proof.py):
  red/green     each of its tests fails on the tree before it (an assertion, or the exception
                the test declares with @pytest.mark.red_raises) and passes after it; a test
                that passes before must be declared in fix.yaml `regression_guards`;
  requirements  applied with only its declared `requires` to the pristine tree, its tests pass;
  parts         with any one hunk / edit left out, at least one of its tests is red.
Then a second run is a no-op, and `revert --all` gives back the pristine bytes. A fix whose
defect needs a Gaudi card is reported as NOT-CPU (its CPU tests held to the same rules),
never as proven.

Each fix checked is a `FixJob`, filled in phase by phase (the chain, red/green, requirements,
parts); `_verdict` turns it into its record, a plain dict (`FixRecord`) as `--json` writes it.
Status lines go through fixpack.cli.output.Lines.
The command is fixpack/cli/commands/check.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, cast, final

from fixpack.errors import SourceUnavailable
from fixpack.proofs import reuse

if TYPE_CHECKING:
    from fixpack.apply.engine import Engine
    from fixpack.apply.state import Step
    from fixpack.cli.output import Lines
    from fixpack.pack.pack import Fix, Pack, Port, Profile
    from fixpack.proofs.proof import Part, RedGreen, TestRun

# The result words of the records: a fix proven, NOT-CPU (its CPU tests hold, the defect needs a
# card) or FAILED; a row for a fix skipped (its sources could not be had) or failing to apply, and
# the re-run and revert rows.
FixResult = Literal["proven", "NOT-CPU", "FAILED"]
RowResult = Literal["skipped", "FAILED", "ok"]
PartResult = Literal["needed", "needed?", "comment-only", "untested (declared)", "UNTESTED"]
RequiresResult = Literal["verified", "FAILED"]


class PartRecord(TypedDict):
    part: str
    result: PartResult
    cause: str


class RequiresRecord(TypedDict):
    declared: list[str]
    result: RequiresResult
    detail: str


class RequiresNeeds(RequiresRecord, total=False):
    needs: str  # the earlier fix that makes its tests pass, when one does


@final
class RowRecord(TypedDict):
    """A fix skipped or failing to apply, or the re-run and revert rows."""

    fix: str
    result: RowResult
    detail: str


@final
class FixRecord(TypedDict):
    """A fix that went through the proofs."""

    fix: str
    tests: list[dict[str, Any]]
    red_green: int
    guards: int
    parts: list[PartRecord]
    n_parts: int | None
    requires: RequiresRecord | None
    seconds: float
    base: str | None
    result: FixResult
    detail: str
    proof: ProofNote


class ProofNote(TypedDict):
    """Whether the record was proven in this run or reused from the ledger, and why."""

    reused: bool
    key: str  # the key's short hash
    why: str  # "unchanged since ..., key ...", or what changed since the last proof


Record = RowRecord | FixRecord


@dataclass
class FixJob:
    """One fix through the phases: the chain fills the fields before ``base``, the later phases
    the rest (None or empty until their phase ran, or when it was not asked for)."""

    fix: Fix
    before: Path  # the chain's tree before it
    after: Path  # and after it
    apply_seconds: float
    compile_errors: list[str]  # "<file>: <message>" for each output that does not compile
    prior: list[Fix]  # the fixes under it in the chain
    pristine: Path  # the tree its requirement proof starts from (_test_bases may give it its own)
    base: str | None = None  # what its tests run on, said (_test_bases)
    runs: tuple[TestRun, TestRun] | None = None  # its tests before, after it
    red_green: RedGreen | None = None
    requires: RequiresRecord | None = None
    n_parts: int | None = None
    parts: list[PartRecord] = field(default_factory=list)
    parts_error: str | None = None


@dataclass
class PartJob:
    """One part of a fix to leave out; ``full`` is the whole change's new bytes."""

    job: FixJob
    part: Part
    full: dict[str, bytes]


@dataclass
class CheckReport:
    """What `check_release` found: one record per fix (and the re-run and revert rows)."""

    profile: str
    port: str | None
    results: list[Record] = field(default_factory=list)
    skipped_sources: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r["result"]] = counts.get(r["result"], 0) + 1
        return counts

    @property
    def totals(self) -> dict:
        return _totals(self.results)


_T = TypeVar("_T")
_R = TypeVar("_R")


def _pool(jobs: int, fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        return list(ex.map(fn, items))


def check_release(
    pack: Pack,
    profile: Profile,
    port: Port | None = None,
    *,
    only: list[str] | None = None,
    workers: int = 2,
    test_timeout: float = 900.0,
    parts: bool = True,
    requires: bool = True,
    quiet: bool = False,
    brief: bool = False,
    fresh: bool = False,
) -> CheckReport:
    """Prove every fix of ``profile`` (or only ``port``'s patches) on a scratch tree of the
    pristine release, ``workers`` test runs at a time; with ``quiet`` no status line is printed
    (warnings go to stderr), otherwise one per fix. A fix whose proof key is the one its last
    good proof was made under is reused from the ledger (fixpack/proofs/reuse.py), unless
    ``fresh``; every fix proven here is recorded there."""
    from fixpack.apply.engine import Engine
    from fixpack.apply.store import Store
    from fixpack.cli.output import Lines
    from fixpack.pack.lockfile import Lock
    from fixpack.proofs import proof
    from fixpack.sources import release, sources

    lines = Lines(quiet=quiet)
    lock = Lock.load(profile.lock_path)
    manifest = json.loads(profile.manifest_path.read_text())["files"]
    t_start = time.perf_counter()
    load_start = round(os.getloadavg()[0], 1) if hasattr(os, "getloadavg") else None
    phase_secs: dict[str, float] = {}
    results: list[Record] = []
    skipped_packages: dict[str, str] = {}
    with release.scratch("fixpack-check-") as work:
        tree = work / "tree"
        tree.mkdir()
        for package, spec in profile.base["sources"].items():
            try:
                sources.materialise({package: spec}, tree)
            except SourceUnavailable as exc:
                skipped_packages[package] = str(exc)
                _warn(lines, f"\n!!! RELEASE CHECK SKIPPED for {package} fixes: {exc}\n")
        found = {p: tree / p for p in profile.packages if (tree / p).is_dir()}
        store = Store(tree / ".fixpack")
        engine = Engine(
            pack, profile, port, profile.opt_ins, found, store, lock, report=Lines(quiet=True), check_idempotent=True
        )
        pristine = proof.snapshot(tree, work / "pristine")

        t0 = time.perf_counter()
        jobs, chain, steps = _build_chain(engine, port, tree, work, pristine, set(found), results)
        phase_secs["chain"] = time.perf_counter() - t0
        by_id = {f.id: f for f in chain}
        for label in _test_bases(profile, jobs, pristine, work):
            lines.say(f"tested on {label}")
        if only is not None:
            unknown = sorted(set(only) - {j.fix.id for j in jobs})
            if unknown:
                _warn(lines, f"!!! --only names fixes not in this chain: {', '.join(unknown)}")
            jobs = [j for j in jobs if j.fix.id in only]

        # 0. reuse: a fix whose every input is unchanged keeps its last good proof
        t0 = time.perf_counter()
        ledger = reuse.Ledger(profile.name + (f"+{port.name}" if port else ""))
        keys = _proof_keys(pack, profile, engine, jobs, parts=parts, requires=requires)
        reused: dict[str, FixRecord] = {}
        why_new: dict[str, str] = {}
        for j in jobs:
            entry, why = (None, "--fresh") if fresh else ledger.lookup(j.fix.id, keys[j.fix.id])
            if entry is not None and entry["record"].get("result") in ("proven", "NOT-CPU"):
                note: ProofNote = {"reused": True, "key": keys[j.fix.id].short, "why": why}
                reused[j.fix.id] = cast(FixRecord, {**entry["record"], "proof": note})
            else:
                why_new[j.fix.id] = why
        all_jobs, jobs = jobs, [j for j in jobs if j.fix.id not in reused]
        phase_secs["reuse"] = time.perf_counter() - t0
        if reused:
            lines.say(f"reused {len(reused)} proof(s) whose inputs are unchanged; proving {len(jobs)}")

        # 1. red/green, per test
        t0 = time.perf_counter()
        _prove_red_green(jobs, workers, test_timeout)
        phase_secs["red_green"] = time.perf_counter() - t0

        # 2. requirements: only the declared requires under it, on the pristine tree
        t0 = time.perf_counter()
        if requires:
            found_reqs = _pool(workers, lambda j: _prove_requires(j, by_id, chain, work, test_timeout), jobs)
            for j, req in zip(jobs, found_reqs, strict=True):
                j.requires = req
        phase_secs["requires"] = time.perf_counter() - t0

        # 3. every part needed
        t0 = time.perf_counter()
        if parts:
            part_jobs = [pj for j in jobs for pj in _part_jobs(j)]
            outs = _pool(workers, lambda pj: _prove_part(pj, test_timeout), part_jobs)
            for pj, out in zip(part_jobs, outs, strict=True):
                pj.job.parts.append(out)
        phase_secs["parts"] = time.perf_counter() - t0

        proof.close_servers()
        for j in all_jobs:
            fid = j.fix.id
            if fid in reused:
                rec = reused[fid]
            else:
                rec = _verdict(j, {"reused": False, "key": keys[fid].short, "why": why_new[fid]})
                if rec["result"] in ("proven", "NOT-CPU"):
                    ledger.store(fid, keys[fid], rec)
            results.append(rec)
            _report_fix(lines, rec, brief=brief)

        # Re-run: nothing to do. Revert: pristine bytes.
        if not any(r["result"] == "FAILED" for r in results) and steps:
            for row in _rerun_and_revert(engine, steps, tree, manifest):
                results.append(row)
                lines.line(row["fix"], row["result"], row["detail"])

    return CheckReport(
        profile=profile.name,
        port=port.name if port else None,
        results=results,
        skipped_sources=skipped_packages,
        seconds=round(time.perf_counter() - t_start, 1),
        phase_seconds={k: round(v, 1) for k, v in phase_secs.items()},
        machine=_machine(load_start),
    )


def _warn(lines: Lines, text: str) -> None:
    # with --json (quiet) stdout is the report: a warning must not break it, nor be lost
    if lines.quiet:
        print(text, file=sys.stderr, flush=True)
    else:
        lines.say(text)


def _build_chain(
    engine: Engine, port: Port | None, tree: Path, work: Path, pristine: Path, found: set[str], results: list[Record]
) -> tuple[list[FixJob], list[Fix], list[Step]]:
    """Apply the fixes in order on ``tree``, snapshotting it before and after each: a job per
    fix applied, the chain of them, the engine's steps. A fix skipped, or the one that fails to
    apply (the last one tried), gets its row in ``results``."""
    from fixpack.proofs import proof

    # the lock was passed in, so the engine holds its selection (or has raised)
    assert engine.pinned is not None
    pins = {s.fix: s.files for s in engine.pinned}
    steps: list[Step] = []
    jobs: list[FixJob] = []
    chain: list[Fix] = []
    for i, fix in enumerate(engine.fixes):
        if port and fix.layer == "profile":
            break  # a port's check proves its own patches; the profile is checked on its own
        missing = sorted({t.package for t in fix.targets} - found)
        if missing:
            results.append({"fix": fix.id, "result": "skipped", "detail": f"{', '.join(missing)} sources unavailable"})
            continue
        before = proof.snapshot(tree, work / f"s{i}-before")
        t1 = time.perf_counter()
        try:
            steps = engine.apply_one(fix, steps, pins[fix.id])
        except Exception as exc:  # a failure of one fix is reported, the rest still checked
            results.append({"fix": fix.id, "result": "FAILED", "detail": f"apply: {exc}"})
            break
        bad = []
        for rel in fix.target_rels:
            if rel.endswith(".py"):
                try:
                    compile((tree / rel).read_bytes(), rel, "exec", dont_inherit=True)
                except SyntaxError as exc:
                    bad.append(f"{rel}: {exc.msg}")
        after = proof.snapshot(tree, work / f"s{i}-after")
        jobs.append(FixJob(fix, before, after, time.perf_counter() - t1, bad, list(chain), pristine))
        chain.append(fix)
    return jobs, chain, steps


def _test_bases(profile: Profile, jobs: list[FixJob], pristine: Path, work: Path) -> list[str]:
    """Which base each fix's tests run on. A fix of a package pinned on its development base is
    tested beside the releases that base imports with (vllm-gaudi main beside vLLM 0.27.0): its
    before/after trees, and the pristine tree its requirement proof starts from, get those."""
    import shutil

    from fixpack.proofs import proof
    from fixpack.sources import sources

    labels: dict[str, str] = {}
    for j in jobs:
        packages = sorted({t.package for t in j.fix.targets})
        if len(packages) != 1:
            # a fix of several packages is tested on the chain's tree, each package on its resolved base
            resolved = sources.resolve(profile.base["sources"], packages)
            j.base = "; ".join(
                f"{p}: {r['base']} base {r['spec'].get('branch') or r['spec'].get('version') or ''} "
                f"{str(r['spec'].get('commit') or '')[:9]}"
                for p, r in resolved.items()
            )
            continue
        specs, label = sources.test_sources(profile.base["sources"], packages[0])
        labels[packages[0]] = label
        j.base = label
        companions = {
            p: s
            for p, s in specs.items()
            if p != packages[0] and s != sources.resolve(profile.base["sources"], [p])[p]["spec"]
        }
        if not companions:
            continue
        own = work / f"pristine-{j.fix.id}"
        proof.snapshot(pristine, own)
        for tree in (j.before, j.after, own):
            for other, spec in companions.items():
                shutil.rmtree(tree / other)  # hard links: the cache and the chain's tree keep their files
                sources.materialise({other: spec}, tree)
        j.pristine = own
    return [labels[p] for p in sorted(labels)]


# The modules that run a proof: what they import of fixpack is followed from them.
PROOF_CODE = (
    "proofs/check.py",
    "proofs/proof.py",
    "proofs/pytest_plugin.py",
    "proofs/release_tree.py",
    "sandbox/forkserver.py",
)


def _import_roots(fix_dir: Path) -> tuple[Path, list[Path]]:
    """The folder of the pytest configuration that a fix's tests run under (the nearest
    pyproject.toml above the fix with [tool.pytest.ini_options]) and its import roots: its
    ``pythonpath`` entries, else itself; fixpack's own parent comes first, as in run_tests."""
    import tomllib

    for folder in [fix_dir, *fix_dir.parents]:
        cfg = folder / "pyproject.toml"
        if cfg.is_file():
            ini = tomllib.loads(cfg.read_text()).get("tool", {}).get("pytest", {}).get("ini_options")
            if ini is not None:
                roots = [(folder / p).resolve() for p in ini.get("pythonpath", [])] or [folder.resolve()]
                return folder, [Path(proof_pkg_parent()), *roots]
    return fix_dir, [Path(proof_pkg_parent()), fix_dir]


def proof_pkg_parent() -> str:
    from fixpack.proofs.proof import PKG_PARENT

    return PKG_PARENT


def _pytest_ini(folder: Path) -> dict:
    import tomllib

    cfg = folder / "pyproject.toml"
    if not cfg.is_file():
        return {}
    return tomllib.loads(cfg.read_text()).get("tool", {}).get("pytest", {}).get("ini_options", {})


def _proof_keys(
    pack: Pack, profile: Profile, engine: Engine, jobs: list[FixJob], *, parts: bool, requires: bool
) -> dict[str, reuse.Key]:
    """Each job's proof key (reuse.Key): a digest for every kind of input its proof reads.

    fix        the fix folder, every file (fix.yaml, change files of every release, tests);
    chain      the lock's pins of every step up to and including it: the bytes of every file
               the chain touched, as the fix's tests meet them before and after it;
    release    the profile's manifest (every file of the pristine trees) and the sources its
               tests run on (release or development base, companions, commits);
    tests      its test files, every conftest.py above them, the pytest configuration, and every
               repository module they import, transitively (reuse.import_closure);
    proof      fixpack's proof code (PROOF_CODE and what it imports of fixpack);
    venv, python, cpu   the interpreter the tests run in: distributions and versions, Python's
               version, the CPU's model and flags;
    options    which phases were asked for (parts, requires).
    Not seen (said in docs/ci.md): files a test opens by a path it computes outside its fix
    folder and the import graph, environment variables, the network."""
    from fixpack.sources import sources

    env = reuse.environment_parts()
    proof_code = proof_code_digest()
    options = reuse.digest_of({"parts": parts, "requires": requires})
    assert engine.pinned is not None
    steps = [{"fix": s.fix, "files": s.files} for s in engine.pinned]
    manifest = reuse.files_digest([profile.manifest_path], profile.manifest_path.parent)
    keys: dict[str, reuse.Key] = {}
    for j in jobs:
        fix = j.fix
        upto = next((i for i, s in enumerate(steps) if s["fix"] == fix.id), len(steps) - 1)
        specs: dict[str, Any] = {}
        for package in sorted({t.package for t in fix.targets}):
            try:
                got, _ = sources.test_sources(profile.base["sources"], package)
                specs[package] = {p: {k: v for k, v in s.items() if k != "why"} for p, s in got.items()}
            except Exception as exc:  # the check itself reports an unavailable source
                specs[package] = f"unavailable: {exc.__class__.__name__}"
        keys[fix.id] = fix_key(
            fix.dir,
            [fix.dir / t for t in fix.meta["tests"]],
            chain=[fix.release, steps[: upto + 1]],
            release=[manifest, j.base, specs],
            proof_code=proof_code,
            options=options,
            env=env,
        )
    return keys


def fix_key(
    fix_dir: Path,
    test_files: list[Path],
    *,
    chain: object,
    release: object,
    proof_code: str,
    options: str,
    env: dict[str, str],
) -> reuse.Key:
    """The proof key of the fix in ``fix_dir`` (the parts are described in _proof_keys)."""
    ini_dir, roots = _import_roots(fix_dir)
    conftests = [
        d / "conftest.py"
        for d in [fix_dir, *fix_dir.parents]
        if (d / "conftest.py").is_file() and ini_dir in [d, *d.parents]
    ]
    tests = reuse.digest_of([reuse.closure_digest(test_files + conftests, roots, ini_dir), _pytest_ini(ini_dir)])
    return reuse.Key(
        {
            "fix": reuse.tree_digest(fix_dir),
            "chain": reuse.digest_of(chain),
            "release": reuse.digest_of(release),
            "tests": tests,
            "proof": proof_code,
            "options": options,
            **env,
        }
    )


def proof_code_digest() -> str:
    """fixpack's proof code: PROOF_CODE and every fixpack module it imports, transitively."""
    pkg_parent = Path(proof_pkg_parent())
    return reuse.closure_digest([pkg_parent / "fixpack" / rel for rel in PROOF_CODE], [pkg_parent], pkg_parent)


def _prove_red_green(jobs: list[FixJob], workers: int, timeout: float) -> None:
    """Each job's tests on its trees before and after it, and the per-test verdicts."""
    from fixpack.proofs import proof

    trees = [(j.fix, tree) for j in jobs for tree in (j.before, j.after)]
    runs = _pool(workers, lambda a: proof.run_tests(a[0], a[1], timeout), trees)
    for k, j in enumerate(jobs):
        j.runs = (runs[2 * k], runs[2 * k + 1])
        j.red_green = proof.red_green(j.fix, *j.runs)


def _prove_requires(job: FixJob, by_id: dict[str, Fix], chain: list[Fix], work: Path, timeout: float) -> RequiresRecord:
    from fixpack.proofs import proof

    fix = job.fix
    try:
        need = proof.requires_closure(fix, by_id)
    except Exception as exc:
        return {"declared": fix.requires, "result": "FAILED", "detail": str(exc)}
    later = [f.id for f in chain[chain.index(fix) + 1 :]] if fix in chain else []
    for c in fix.meta.get("completed_by") or []:
        # A later fix this one is incomplete without: it must be in the selection, after it,
        # and require it, so that its tests run with both.
        where = f"{fix.dir / 'fix.yaml'}: completed_by {c!r}"
        bad = (
            f"{where} is not in this selection"
            if c not in by_id
            else f"{where} does not come after it in the pack order"
            if c not in later
            else f"{where} does not require {fix.id}, so no test of it runs with both"
            if fix.id not in proof.requires_closure(by_id[c], by_id)
            else ""
        )
        if bad:
            return {"declared": fix.requires, "result": "FAILED", "detail": bad}
    prior = {f.id for f in job.prior}
    if prior <= need:
        return {
            "declared": fix.requires,
            "result": "verified",
            "detail": "the chain before it is its requires: its green run is this proof",
        }

    def attempt(ids: set[str], tag: str) -> tuple[bool, str]:
        fixes = [f for f in chain if f.id in ids or f.id == fix.id]
        dest = work / f"req-{fix.id}-{tag}"
        try:
            proof.build_tree(job.pristine, dest, fixes)
        except Exception as exc:
            return False, f"does not apply: {exc}"
        run = proof.run_tests(fix, dest, timeout)
        failing = [(n, proof.green_of(r)[1]) for n, r in run.tests.items() if not proof.green_of(r)[0]]
        if not run.reported or failing or run.collect_errors:
            why = failing[0][1] if failing else (run.collect_errors[0]["cause"] if run.collect_errors else run.summary)
            return False, f"{len(failing) or 'its'} test(s) fail: {why}"
        return True, f"{len(run.tests)} tests pass"

    ok, detail = attempt(need, "declared")
    declared = ", ".join(sorted(need)) or "none"
    if ok:
        return {"declared": fix.requires, "result": "verified", "detail": f"with only [{declared}]: {detail}"}
    # Name the earlier fix it needs: the nearest one first.
    for cand in reversed(job.prior):
        if cand.id in need:
            continue
        more = need | {cand.id} | proof.requires_closure(cand, by_id)
        ok2, _ = attempt(more, cand.id)
        if ok2:
            needs: RequiresNeeds = {
                "declared": fix.requires,
                "result": "FAILED",
                "needs": cand.id,
                "detail": f"with only [{declared}]: {detail}; passes once {cand.id} is under it: "
                f"declare requires: [{cand.id}]",
            }
            return needs
    return {
        "declared": fix.requires,
        "result": "FAILED",
        "detail": f"with only [{declared}]: {detail}; no single earlier fix makes it pass",
    }


def _part_jobs(job: FixJob) -> list[PartJob]:
    """The fix's parts to leave out one at a time (none for a single part); sets ``n_parts``, or
    ``parts_error`` when the change cannot be re-applied as the engine applied it."""
    from fixpack.proofs import proof

    fix, before, after = job.fix, job.before, job.after
    try:
        full, parts = proof.apply_change(fix, before)
    except Exception as exc:
        job.parts_error = f"cannot re-apply the change for the part proof: {exc}"
        return []
    # The change applied here must be what the engine wrote, or the proof is of something else.
    differ = [
        rel for rel in fix.target_rels if full.get(rel, (before / rel).read_bytes()) != (after / rel).read_bytes()
    ]
    if differ:
        job.parts_error = f"re-applied change differs from the engine's output in {', '.join(differ)}"
        return []
    job.n_parts = len(parts)
    if len(parts) < 2:
        return []
    return [PartJob(job, part, full) for part in parts]


def _prove_part(pj: PartJob, timeout: float) -> PartRecord:
    import shutil

    from fixpack.proofs import proof

    job, part, full = pj.job, pj.part, pj.full
    fix = job.fix
    dest = job.before.parent / f"part-{fix.id}-{part.index}"
    try:
        changes, _ = proof.apply_change(fix, job.before, part.index)
    except Exception as exc:
        return {
            "part": part.label,
            "result": "needed",
            "cause": f"the other parts do not apply without it: {str(exc)[:160]}",
        }
    same_code = all(proof.same_code(changes.get(rel, b""), full[rel]) for rel in full if rel.endswith(".py"))
    if same_code and set(changes) <= set(full):
        return {"part": part.label, "result": "comment-only", "cause": "changes only comments or blank lines"}
    proof.snapshot(job.before, dest)
    for rel, data in changes.items():
        proof.replace_file(dest / rel, data)
    for rel in changes:
        if rel.endswith(".py"):
            try:
                compile(changes[rel], rel, "exec", dont_inherit=True)
            except SyntaxError as exc:
                return {
                    "part": part.label,
                    "result": "needed",
                    "cause": f"{rel} does not compile without it ({exc.msg})",
                }
    run = proof.run_tests(fix, dest, timeout, stop_at_first_failure=True)
    shutil.rmtree(dest, ignore_errors=True)
    for nodeid, rec in run.tests.items():
        fail = proof._failure(rec)
        if fail is not None:
            cause = fail[1].get("cause", fail[1]["outcome"])
            return {
                "part": part.label,
                "result": "needed",
                "cause": f"without it {nodeid.split('::', 1)[-1]} is red: {cause}",
            }
    if run.collect_errors:
        return {"part": part.label, "result": "needed", "cause": f"collection fails: {run.collect_errors[0]['cause']}"}
    if not run.reported:
        return {"part": part.label, "result": "needed?", "cause": run.summary}
    declared = {d.get("part"): d.get("why") for d in (fix.meta.get("untested_parts") or [])}
    if part.label in declared:
        return {"part": part.label, "result": "untested (declared)", "cause": declared[part.label]}
    return {
        "part": part.label,
        "result": "UNTESTED",
        "cause": "every test still passes without it: nothing tests it, or it is not needed",
    }


def _verdict(job: FixJob, note: ProofNote) -> FixRecord:
    fix = job.fix
    rg, runs = job.red_green, job.runs
    assert rg is not None and runs is not None  # the red/green phase ran for every job
    problems = list(rg["problems"])
    if job.compile_errors:
        problems.insert(0, "does not compile: " + "; ".join(job.compile_errors))
    req = job.requires
    if req and req["result"] != "verified":
        problems.append("requires: " + req["detail"])
    parts = job.parts
    if job.parts_error:
        problems.append(job.parts_error)
    for p in parts:
        if p["result"] in ("UNTESTED", "needed?"):
            problems.append(f"part {p['part']}: {p['cause']}")
    if parts:
        labels = {p["part"] for p in parts}
        for d in fix.meta.get("untested_parts") or []:
            if d.get("part") not in labels:
                problems.append(
                    f"{fix.dir / 'fix.yaml'}: untested_parts names {d.get('part')!r}, which is no part of the change"
                )
    if not parts and job.n_parts == 1 and rg["red_green"]:
        # a single part is left out by taking the fix out: its red/green is that proof
        parts = [{"part": "(the whole change)", "result": "needed", "cause": "its only part: its red/green shows it"}]
    result: FixResult
    if problems:
        result, detail = "FAILED", "; ".join(problems)
    elif not fix.cpu_demonstrable:
        result = "NOT-CPU"
        detail = (
            f"not demonstrable on CPU (device gate: {fix.meta['device_gate']['gate']}); "
            f"its CPU tests hold: {rg['red_green']} red then green, {rg['guards']} guards"
        )
    else:
        result, detail = "proven", f"{rg['red_green']} red then green, {rg['guards']} guards"
    return {
        "fix": fix.id,
        "tests": rg["tests"],
        "red_green": rg["red_green"],
        "guards": rg["guards"],
        "parts": parts,
        "n_parts": job.n_parts,
        "requires": req,
        "seconds": round(job.apply_seconds + sum(r.seconds for r in runs), 1),
        "base": job.base,
        "result": result,
        "detail": detail,
        "proof": note,
    }


def _report_fix(lines: Lines, rec: FixRecord, brief: bool = False) -> None:
    note = rec["proof"]
    if note["reused"]:
        lines.line(rec["fix"], rec["result"], f"reused ({note['why']}): {rec['detail']}")
        return
    parts = rec["parts"]
    needed = sum(1 for p in parts if p["result"] == "needed")
    status = f"{rec['seconds']:5.1f}s  {len(rec['tests'])} tests: {rec['red_green']} red->green, {rec['guards']} guards"
    if rec["n_parts"]:
        status += f"; parts needed {needed}/{rec['n_parts']}"
        other = {k: sum(1 for p in parts if p["result"] == k) for k in ("untested (declared)", "comment-only")}
        status += "".join(f", {v} {k}" for k, v in other.items() if v)
    if rec["requires"]:
        status += f"; requires {rec['requires']['result']}"
    lines.line(rec["fix"], rec["result"], status)
    lines.say(f"    proven now, key {note['key']}: {note['why']}")
    if brief:
        if rec["result"] == "FAILED":
            lines.say(f"    FAILED: {rec['detail']}"[:2000])
        return
    for t in rec["tests"]:
        mark = ("red->green" if t["role"] == "red-green" else "guard") if t["ok"] else "BAD"
        lines.say(f"    {mark:<10} {t['test']}: {t['cause']}"[:240])
    for p in parts:
        if p["result"] != "needed" or len(parts) > 1:
            lines.say(f"    part {p['result']:<10} {p['part']}: {p['cause']}"[:240])
    if rec["result"] == "FAILED":
        lines.say(f"    FAILED: {rec['detail']}"[:2000])


def _rerun_and_revert(engine: Engine, steps: list[Step], tree: Path, manifest: dict) -> list[RowRecord]:
    """The re-run row (a second apply of the whole chain does nothing) and the revert row
    (`revert --all` gives back the manifest's bytes)."""
    from fixpack.apply.engine import revert
    from fixpack.apply.hashing import sha256_file

    rerun_noop = engine.fast_path_done() if len(steps) == len(engine.fixes) else None
    revert(engine, None)
    drift = []
    for s in steps:
        for rel in s.files:
            pkg, sub = rel.split("/", 1)
            if sha256_file(tree / rel) != manifest[pkg][sub]:
                drift.append(rel)
    rerun_detail = {
        True: "second apply is a no-op",
        None: "n/a (partial chain)",
        False: "a second apply is not a no-op: the fast path does not find the chain applied",
    }[rerun_noop]
    return [
        {"fix": "(re-run)", "result": "ok" if rerun_noop in (True, None) else "FAILED", "detail": rerun_detail},
        {
            "fix": "(revert --all)",
            "result": "ok" if not drift else "FAILED",
            "detail": "pristine bytes restored" if not drift else f"not pristine: {drift}",
        },
    ]


def _machine(load_start: float | None) -> dict:
    """What the timings were measured on: they are only comparable with this beside them."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load_end = round(os.getloadavg()[0], 1) if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cpus": os.cpu_count(), "load_start": load_start, "load_end": load_end}


def _totals(results: list[Record]) -> dict:
    fixes = [r for r in results if "tests" in r]
    parts = [p for r in fixes for p in r["parts"]]
    return {
        "fixes": len(fixes),
        "tests": sum(len(r["tests"]) for r in fixes),
        "red_green": sum(r["red_green"] for r in fixes),
        "guards": sum(r["guards"] for r in fixes),
        "parts": sum(r["n_parts"] or 0 for r in fixes),
        "parts_needed": sum(1 for p in parts if p["result"] == "needed"),
        "parts_comment_only": sum(1 for p in parts if p["result"] == "comment-only"),
        "parts_untested": sum(1 for p in parts if p["result"].startswith(("UNTESTED", "untested"))),
        "requires_verified": sum(1 for r in fixes if r["requires"] and r["requires"]["result"] == "verified"),
    }
