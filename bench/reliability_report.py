#!/usr/bin/env python3
"""The engine's reliability campaign in one run; prints the table for the README.

    .venv/bin/python -m bench.reliability_report [--sample N] [--jobs 2] [--json FILE]

(from the repository root: `-m` puts it on sys.path, so the test helpers, packtests, import as a package)

1. kill sweeps: SIGKILL `fixpack apply` at every write point (FIXPACK_CRASH_AT) of a full
   run of the real v0.26.0 profile on its release tree, and of a larger synthetic chain
   profile; the same for `fixpack revert --all`; every 10th point also kills the recovery
   run. After each: every file pristine or pinned right after the kill, a rerun completes,
   verify agrees, revert --all gives back the pristine bytes and modes.
2. resource faults: an injected ENOSPC at every file write of a run, then the named
   scenarios (full tmpfs, read-only mount, chattr +i, targets swapped mid-run, state record
   and journal lost or corrupted, backups lost, lock held, ...).
3. concurrency: 8 runs at once, apply against revert, a lock holder killed.
4. hostile input: every case of packtests/hostile_cases.py.
5. sandbox: every escape of packtests/sandbox_cases.py (a fix's process writing outside its
   targets, or using a privilege or another process, through libc, which the audit hook cannot
   see), once under Landlock (refused by the kernel) and once with Landlock forced off (caught
   and undone by the driver's snapshot, or refused: no capabilities, the privileged-call filter).
6. state: attacks on the driver itself, each with the kernel layers on and forced
   off: a forged state record, a planted journal, folders swapped for symlinks during the run
   (restore, commit, the state folder), a __pycache__ symlink, a limit exceeded, a process that outlives its
   fix (tests/integration/test_hostile_state.py, test_hostile_restore.py, test_limits.py, run as they are).

The CI tests run a sample of each (tests/integration/test_reliability_*.py, test_hostile_input.py).
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

from packtests import hostile_cases as H
from packtests import reliability_lib as L
from packtests import sandbox_cases as S

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


def state_cases() -> list[tuple[str, callable]]:
    """The driver-attack tests (state, restores, limits, survivors), called as they are with a
    scratch folder for tmp_path (the same code CI runs, not a copy). A pytest skip (no Landlock
    here) is reported as not run."""
    from tests.integration import test_hostile_restore as HR
    from tests.integration import test_hostile_state as HS
    from tests.integration import test_limits as TL

    def case(fn, *args, what: str):
        def run(w: Path):
            w.mkdir(parents=True, exist_ok=True)
            try:
                fn(w, *args)
            except BaseException as exc:
                if type(exc).__name__ == "Skipped":  # pytest.skip
                    raise L.Skip(str(exc)) from None
                raise
            return what

        return run

    out: list[tuple[str, callable]] = []
    for mode in ("auto", "hook"):
        out.append((f"forged state record ({mode})", case(HS.test_a_state_record_claiming_every_fix_applied_is_drift_for_apply_verify_and_revert, mode, what="drift, exit 5")))
        out.append((f"planted journal ({mode})", case(HS.test_a_planted_journal_is_never_recovered, mode, what="drift, exit 5, never finished")))
        out.append((f"survivor after setsid and a double fork ({mode})", case(TL.test_a_setsid_double_forked_grandchild_does_not_outlive_its_fix, mode, what="killed")))
        for name, setting, body, msg in TL.CASES:
            out.append((f"limit {setting} exceeded ({mode})", case(TL.test_an_exceeded_limit_fails_the_fix_naming_it, name, setting, body, msg, mode, what="fix X exceeded, exit 4")))
    for mode in ("landlock", "hook"):
        out.append((f"folder swapped for a symlink by another process ({mode})", case(HR.test_another_process_swaps_a_folder_made_during_the_run_for_a_symlink, mode, what="exit 6, nothing restored through it")))
    out.append(("fix swaps its folder for a symlink (hook)", case(HR.test_a_fix_that_swaps_its_folder_for_a_symlink_gets_no_write_outside_without_the_kernel, what="exit 6, nothing restored through it")))
    out.append(("package folder swapped during the commit", case(HR.test_a_commit_never_writes_through_a_package_folder_swapped_for_a_symlink, what="exit 6, nothing written through it")))
    out.append(("__pycache__ symlink", case(HR.test_stale_bytecode_is_never_removed_through_a_pycache_symlink, what="exit 6, nothing removed through it")))
    out.append(("state folder a symlink, or writable by others", case(HR.test_a_state_folder_that_is_a_symlink_or_not_ours_is_refused, what="exit 6, nothing written")))
    out.append(("state folder swapped for a symlink mid-run", case(HR.test_a_state_folder_swapped_during_the_run_gets_no_write, what="exit 6, nothing written through it")))
    out.append(("pinned step, unpinned journal files", case(HS.test_a_journal_whose_step_is_pinned_but_whose_files_are_not_is_refused, what="drift, exit 5")))
    out.append(("change file over 1 MiB", case(TL.test_a_change_file_larger_than_the_bound_is_refused_before_it_is_read, what="exit 2")))
    # issue 41: reads that never block, trees of any shape, isolated interpreters
    from tests.integration import test_hostile_reads as HR41
    from tests.integration import test_isolation as TI

    for kind in ("fifo", "symlink-to-dev-zero", "char-device", "folder", "sparse-16g"):
        out.append((f"backup object a {kind}", case(HR41.test_a_backup_that_is_no_regular_file_stops_revert_by_name_at_once, kind, what="drift, exit 5, no hang")))
    out.append(("16 GiB sparse journal", case(HR41.test_a_journal_that_is_no_regular_file_or_huge_is_unreadable_not_read, "sparse-16g", what="exit 5, not read")))
    out.append(("state record a FIFO", case(HR41.test_a_state_record_that_is_no_regular_file_is_corrupt_and_apply_rebuilds_it, "fifo", what="corrupt, rebuilt, no hang")))
    out.append(("state folder of another user holding a FIFO", case(HR41.test_the_state_folder_owner_is_checked_before_its_files_are_read, what="exit 6 before any read")))
    out.append(("run lock private", case(HR41.test_the_run_lock_is_private, what="mode 0600")))
    out.append(("3,000-deep chain made in the tree (hook)", case(HR41.test_without_the_kernel_a_fix_making_a_3000_deep_chain_in_the_tree_is_undone_whole, what="exit 4, removed whole")))
    for kind in ("diff", "codemod"):
        out.append((f"planted .pth file ({kind} server)", case(TI.test_a_planted_pth_file_runs_in_no_fork_server_and_no_fix_process, kind, what="runs in no server")))
    out.append(("planted .pth file, python -I -S apply_all.py", case(TI.test_with_dash_i_dash_s_the_planted_pth_runs_nowhere_and_apply_all_still_works, what="runs nowhere")))
    for how in ("mode-777", "owned-by-another-user", "parent-777-without-sticky"):
        out.append((f"path entry writable by another user ({how})", case(TI.test_a_path_entry_another_user_can_write_is_refused_by_name_before_anything_starts, how, what="exit 6, named")))
    return out



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=None, help="kill only N points per sweep (default: every point)")
    ap.add_argument("--revert-sample", type=int, default=None, help="kill only N points of the revert sweeps (default: --sample)")
    ap.add_argument("--real-sample", type=int, default=None, help="kill only N points of the real profile's apply sweep (default: --sample)")
    ap.add_argument("--real-revert-sample", type=int, default=None, help="kill only N points of the real profile's revert sweep (default: --revert-sample; 0: no revert sweep)")
    ap.add_argument("--real-head", type=int, default=None, help="sample the real profile's points among its first N only (no full enumeration run)")
    ap.add_argument("--jobs", type=int, default=1, help="kill points run in parallel")
    ap.add_argument("--skip-real", action="store_true", help="leave out the v0.26.0 release tree")
    ap.add_argument("--only", nargs="*", default=["sweep", "faults", "concurrency", "hostile", "sandbox", "state"])
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
                if mode == "hook":
                    refused = sum(e.hook == "refused" for e in S.ESCAPES)
                    label = f"{label} ({len(S.ESCAPES) - refused}) or refused by no capabilities or the privileged-call filter ({refused})"
                figures[f"sandbox-{mode}"] = {"tried": r["tried"], "ok": r["survived"], "failed": r["failed"], "label": label}

        if "state" in args.only:
            say("state, restores, limits, survivors:")
            figures["state"] = run_named(state_cases(), work, "state", args.jobs)

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
    for mode, what in (
        ("landlock", "a fix's process escaping by libc (writes, metadata, device nodes, other processes, sockets, modules, fork): Landlock + seccomp on"),
        ("hook", "the same with Landlock and the metadata filter forced off (capabilities dropped, privileged-call filter, audit hook, snapshot)"),
    ):
        if f"sandbox-{mode}" in figures:
            x = figures[f"sandbox-{mode}"]
            rows.append((what, f"{x['tried']} escapes", f"{x['ok']} {x['label']}; tree and a decoy outside it unchanged", f"{len(x['failed'])} failed"))
    if "state" in figures:
        x = figures["state"]
        rows.append(("forged state record, planted journal, folders swapped for symlinks mid-run, limits, survivors (each with the kernel layers on and off)",
                     f"{x['tried']} cases", f"{x['survived']} refused or contained as expected, nothing outside the tree changed", f"{len(x['failed'])} failed"))
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
    bad |= any(figures.get(p, {}).get("failed") for p in ("enospc", "faults", "concurrency", "hostile", "sandbox-landlock", "sandbox-hook", "state"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
