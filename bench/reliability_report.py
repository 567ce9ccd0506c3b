#!/usr/bin/env python3
"""The engine's reliability campaign in one run; prints the table for the README.

    .venv/bin/python -m bench.reliability_report [--sample N] [--jobs 2] [--json FILE]

(from the repository root: `-m` puts it on sys.path, so the testing helpers import as a package)

1. kill sweeps: SIGKILL `fixpack apply` at every write point (FIXPACK_CRASH_AT) of a full
   run of the real v0.26.0 profile on its release tree, and of a larger synthetic chain
   profile; the same for `fixpack revert --all`; every 10th point also kills the recovery
   run. After each: every file pristine or pinned right after the kill, a rerun completes,
   verify agrees, revert --all gives back the pristine bytes and modes.
2. resource faults: an injected ENOSPC at every file write of a run, then the named
   scenarios (full tmpfs, read-only mount, chattr +i, targets swapped mid-run, state record
   and journal lost or corrupted, backups lost, lock held, ...).
3. concurrency: 8 runs at once, apply against revert, a lock holder killed.
4. hostile input: every case of testing/hostile_cases.py.
5. sandbox: every escape of testing/sandbox_cases.py (a fix's process writing outside its
   targets through libc, which the audit hook cannot see), once under Landlock (refused by
   the kernel) and once with Landlock forced off (caught and undone by the driver's snapshot).

The CI tests run a sample of each (tests/test_reliability_*.py, tests/test_hostile_input.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from testing import hostile_cases as H
from testing import reliability_lib as L
from testing import sandbox_cases as S

HERE = Path(__file__).resolve().parent


def say(*a):
    print(*a, flush=True, file=sys.stderr)


def run_named(parts: list[tuple[str, callable]], work: Path, kind: str, jobs: int = 1) -> dict:
    res = {"tried": 0, "survived": 0, "skipped": [], "failed": []}
    import threading

    mutex = threading.Lock()

    def one(item):
        detail = _one(item)
        if detail is not None:
            with mutex:
                res["tried"] += 1
                res["survived"] += detail

    def _one(item):
        i, (name, fn) = item
        t0 = time.perf_counter()
        try:
            detail = fn(work / f"{kind}-{i}")
        except L.Skip as exc:
            res["skipped"].append(f"{name}: {exc}")
            say(f"  skip  {name}: {exc}")
            return None
        except Exception as exc:  # an AssertionError is a finding
            res["failed"].append(f"{name}: {''.join(traceback.format_exception_only(exc)).strip()[-600:]}")
            say(f"  FAIL  {name}: {str(exc)[-600:]}")
            return 0
        say(f"  ok    {name}: {detail} ({time.perf_counter() - t0:.1f}s)")
        shutil.rmtree(work / f"{kind}-{i}", ignore_errors=True)
        return 1

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, jobs)) as ex:
        list(ex.map(one, enumerate(parts)))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=None, help="kill only N points per sweep (default: every point)")
    ap.add_argument("--revert-sample", type=int, default=None, help="kill only N points of the revert sweeps (default: --sample)")
    ap.add_argument("--real-sample", type=int, default=None, help="kill only N points of the real profile's apply sweep (default: --sample)")
    ap.add_argument("--real-revert-sample", type=int, default=None, help="kill only N points of the real profile's revert sweep (default: --revert-sample; 0: no revert sweep)")
    ap.add_argument("--real-head", type=int, default=None, help="sample the real profile's points among its first N only (no full enumeration run)")
    ap.add_argument("--jobs", type=int, default=1, help="kill points run in parallel")
    ap.add_argument("--skip-real", action="store_true", help="leave out the v0.26.0 release tree")
    ap.add_argument("--only", nargs="*", default=["sweep", "faults", "concurrency", "hostile", "sandbox"])
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fixpack-reliability-"))
    t_start = time.perf_counter()
    figures: dict = {"sweeps": [], "notes": []}
    try:
        if "hostile" in args.only:
            say("hostile input:")
            L.template("basic"), L.template("codemod-first")  # built once, before the threads
            h = run_named([(c.id, lambda w, c=c: H.run_case(c, w) and c.what) for c in H.CASES], work, "hostile", args.jobs)
            figures["hostile"] = {"tried": h["tried"], "refused": h["survived"], "failed": h["failed"]}

        if "sandbox" in args.only:
            L.template("codemod-first")
            no_kernel = S.landlock_here()
            for mode, label in (("landlock", "refused by the kernel"), ("hook", "caught and undone")):
                if mode == "landlock" and no_kernel:
                    figures["notes"].append(f"sandbox escapes under Landlock not run: {no_kernel}")
                    continue
                say(f"sandbox escapes, {mode}:")
                r = run_named([(f"{e.id} ({mode})", lambda w, e=e, mode=mode: S.run_escape(e, mode, w) and e.what) for e in S.ESCAPES], work, f"sandbox-{mode}", args.jobs)
                figures[f"sandbox-{mode}"] = {"tried": r["tried"], "ok": r["survived"], "failed": r["failed"], "label": label}

        if "faults" in args.only:
            say("resource faults: an injected ENOSPC at every file write of a run")
            n_writes = L.count_writes(work / "enospc")
            sweep = [(f"ENOSPC at file write {n} of {n_writes} (disk stays full)", lambda w, n=n: L.fault_errno_at(w, n)) for n in range(1, n_writes + 1)]
            figures["enospc"] = run_named(sweep, work, "enospc", args.jobs)
            say("resource faults: named scenarios")
            L.template("chain")
            figures["faults"] = run_named(L.fault_scenarios(), work, "fault", args.jobs)

        if "concurrency" in args.only:
            say("concurrency:")
            figures["concurrency"] = run_named(L.concurrency_scenarios(), work, "conc")

        if "sweep" in args.only:
            subjects = []
            if not args.skip_real:
                try:
                    say("real v0.26.0 release tree" + ("" if L.lock_is_current(L.REPO) is None else ": the committed lock lags the profile, regenerating it in a scratch copy of the pack"))
                    subjects.append(L.real_subject(work, relock=True))
                except Exception as exc:
                    figures["notes"].append(f"real v0.26.0 sweep not run: {exc}")
                    say(f"real v0.26.0 sweep not run: {exc}")
            subjects.append(L.synthetic_subject(work, "chain"))
            for subject in subjects:
                for phase in ("apply", "revert"):
                    sample = args.sample if phase == "apply" else (args.revert_sample if args.revert_sample is not None else args.sample)
                    head = None
                    if not subject.name.startswith("synthetic"):
                        real = args.real_sample if phase == "apply" else args.real_revert_sample
                        sample = real if real is not None else sample
                        head = args.real_head
                    if sample == 0:
                        continue
                    say(f"kill sweep: {subject.name}, {phase}")
                    try:
                        s = L.sweep(subject, work, phase, sample=sample, nested_every=10, jobs=args.jobs, head=head,
                                    progress=lambda r: say(f"  {'ok  ' if r.recovered else 'FAIL'}  {r.phase} point {r.n:4d} {r.label}" + ("" if r.recovered else f": {r.lost + r.problems}")))
                    except L.SweepUnavailable as exc:
                        figures["notes"].append(str(exc))
                        say(f"  not run: {exc}")
                        continue
                    figures["sweeps"].append({
                        "subject": subject.name, "phase": phase, "points": s.points_total, "tried": s.tried, "recovered": s.recovered,
                        "files_lost": s.files_lost, "seconds": round(s.seconds, 1), "fixes": len(subject.selection()["steps"]), "head": head,
                        "files": len(subject.lock["pristine"]),
                        "failures": [{"n": f.n, "label": f.label, "lost": f.lost, "problems": f.problems} for f in s.failures],
                    })
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures["seconds"] = round(time.perf_counter() - t_start, 1)

    rows = []
    for s in figures["sweeps"]:
        of = f"of the first {s['points']}" if s.get("head") else f"of {s['points']}"
        rows.append((f"kill -9 `{s['phase']}` at its write points: {s['subject']} ({s['fixes']} fixes, {s['files']} files)",
                     f"{s['tried']} {of} points", f"{s['recovered']} recovered", f"{s['files_lost']} files lost"))
    if figures["sweeps"]:
        t = sum(s["tried"] for s in figures["sweeps"])
        rows.append(("**kill sweeps, total**", f"**{t} points**", f"**{sum(s['recovered'] for s in figures['sweeps'])} recovered**", f"**{sum(s['files_lost'] for s in figures['sweeps'])} files lost**"))
    if "enospc" in figures:
        e = figures["enospc"]
        rows.append(("ENOSPC injected at each file write of a run", f"{e['tried']} faults", f"{e['survived']} survived", f"{len(e['failed'])} failed"))
    if "faults" in figures:
        f = figures["faults"]
        rows.append(("named resource faults (disk, read-only, permission, swaps, state, journal, backups, lock)", f"{f['tried']} faults", f"{f['survived']} survived",
                     f"{len(f['failed'])} failed, {len(f['skipped'])} not injectable here"))
    if "concurrency" in figures:
        c = figures["concurrency"]
        rows.append(("concurrent runs on one tree", f"{c['tried']} scenarios", f"{c['survived']} correct", f"{len(c['failed'])} failed"))
    if "hostile" in figures:
        h = figures["hostile"]
        rows.append(("hostile and malformed input", f"{h['tried']} cases", f"{h['refused']} refused as expected", f"{len(h['failed'])} failed"))
    for mode, what in (("landlock", "a fix's process writing outside its targets or its metadata by libc: Landlock + seccomp on"), ("hook", "the same with both forced off (audit hook + snapshot)")):
        if f"sandbox-{mode}" in figures:
            x = figures[f"sandbox-{mode}"]
            rows.append((what, f"{x['tried']} escapes", f"{x['ok']} {x['label']}, tree unchanged", f"{len(x['failed'])} failed"))
    print("| what | tried | outcome | lost / failed |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    for n in figures["notes"]:
        print(f"\nnote: {n}")
    for part in ("enospc", "faults", "concurrency"):
        for s in figures.get(part, {}).get("skipped", []):
            print(f"\nnot injectable here: {s}")
    print(f"\n({figures['seconds']:.0f} s on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    bad = any(s["files_lost"] or s["recovered"] != s["tried"] for s in figures["sweeps"])
    bad |= any(figures.get(p, {}).get("failed") for p in ("enospc", "faults", "concurrency", "hostile", "sandbox-landlock", "sandbox-hook"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
