"""fixpack check: prove every fix against the pristine release sources.

For each fix, in pack order, on a scratch tree of the release: it applies and gives its
pinned hashes; its tests fail on the tree before it and pass after it (red/green); its
output compiles (and a codemod is a fixed point of itself). Then a second run is a no-op,
and `revert --all` gives back the pristine bytes. A fix whose defect needs a Gaudi card is
reported as not demonstrable on CPU, never as passed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from fixpack.commands._common import emit_json, pack_of, profile_name
from fixpack.errors import CheckFailed, SourceUnavailable


def add_parser(sub):
    p = sub.add_parser("check", help="red/green proof of every fix against the pristine release sources")
    p.add_argument("--profile")
    p.add_argument("--pack", type=Path)
    p.add_argument("--port", help="check a port's patches (stacked on its profile) instead of the profile")
    p.add_argument("--only", nargs="*", default=None, help="check only these fixes (the chain before them is still applied)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="test runs in parallel")
    p.add_argument("--test-timeout", type=float, default=900.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run_tests(fix, tree: Path, timeout: float) -> tuple[int, str]:
    import subprocess

    env = dict(os.environ, FIXPACK_TREE=str(tree), PYTHONDONTWRITEBYTECODE="1")
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    tests = [str(fix.dir / t) for t in fix.meta["tests"]]
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "fixpack.testing.plugin", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(fix.dir), *tests]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=fix.dir)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    lines = [l for l in proc.stdout.strip().splitlines() if l.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-300:]
    return proc.returncode, summary


def snapshot(tree: Path, dest: Path) -> Path:
    """A hard-linked copy: fixpack replaces files by rename, so later steps never write through."""
    import shutil

    def link(src, dst):
        os.link(src, dst)
        return dst

    shutil.copytree(tree, dest, copy_function=link, ignore=shutil.ignore_patterns(".fixpack", "__pycache__"))
    return dest


def run(args) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from fixpack import release
    from fixpack.engine import Engine, Reporter
    from fixpack.lockfile import Lock
    from fixpack.store import Store

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    port = pack.port(args.port) if args.port else None
    lock = Lock.load(profile.lock_path)
    manifest = json.loads(profile.manifest_path.read_text())["files"]
    t_start = time.perf_counter()
    results: list[dict] = []
    skipped_packages: dict[str, str] = {}

    with release.scratch("fixpack-check-") as work:
        tree = work / "tree"
        tree.mkdir()
        from fixpack import sources

        for package, spec in profile.base["sources"].items():
            try:
                sources.materialise({package: spec}, tree)
            except SourceUnavailable as exc:
                skipped_packages[package] = str(exc)
                print(f"\n!!! RELEASE CHECK SKIPPED for {package} fixes: {exc}\n", flush=True)
        found = {p: tree / p for p in profile.packages if (tree / p).is_dir()}
        store = Store(tree / ".fixpack")
        engine = Engine(pack, profile, port, profile.opt_ins, found, store, lock, report=Reporter(quiet=True), check_idempotent=True)
        pins = {s["fix"]: s["files"] for s in engine.pinned["steps"]}
        chain = [f for f in engine.fixes if (f.layer != "profile") == bool(port)] if port else engine.fixes
        # Build the chain once, snapshotting the tree before and after each fix.
        steps: list[dict] = []
        jobs = []
        for i, fix in enumerate(engine.fixes):
            if port and fix.layer == "profile":
                break  # a port's check proves its own patches; the profile is checked on its own
            missing = sorted({t.package for t in fix.targets} - set(found))
            if missing:
                results.append({"fix": fix.id, "result": "skipped", "detail": f"{', '.join(missing)} sources unavailable"})
                continue
            before = snapshot(tree, work / f"s{i}-before")
            t0 = time.perf_counter()
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
            after = snapshot(tree, work / f"s{i}-after")
            jobs.append((fix, before, after, time.perf_counter() - t0, bad))
        if args.only is not None:
            jobs = [j for j in jobs if j[0].id in args.only]

        def prove(job):
            fix, before, after, t_apply, bad = job
            t0 = time.perf_counter()
            red_rc, red = run_tests(fix, before, args.test_timeout)
            green_rc, green = run_tests(fix, after, args.test_timeout)
            secs = time.perf_counter() - t0 + t_apply
            if bad:
                return {"fix": fix.id, "result": "FAILED", "detail": "does not compile: " + "; ".join(bad), "seconds": secs}
            rec = {"fix": fix.id, "before": red, "after": green, "before_rc": red_rc, "after_rc": green_rc, "seconds": round(secs, 1)}
            if not fix.cpu_demonstrable:
                ok = green_rc == 0
                rec.update(result="NOT-CPU" if ok else "FAILED", detail=f"not demonstrable on CPU ({fix.meta['device_gate']['gate']}); CPU test after: {green}")
                return rec
            if red_rc == 1 and green_rc == 0:
                rec.update(result="proven", detail=f"red: {red} | green: {green}")
            else:
                why = "its test does not fail before the fix" if red_rc == 0 else f"before: {red}" if red_rc != 1 else f"after: {green}"
                rec.update(result="FAILED", detail=why)
            return rec

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            for rec in ex.map(prove, jobs):
                results.append(rec)
                if not args.json:
                    name = rec["fix"]
                    print(f"{name}{'.' * max(3, 40 - len(name))}{rec['result']:<9} {rec.get('seconds', 0):5.1f}s  {rec['detail']}", flush=True)
        # Re-run: nothing to do. Revert: pristine bytes.
        if not any(r["result"] == "FAILED" for r in results) and steps:
            rerun_noop = engine.fast_path_done() if len(steps) == len(engine.fixes) else None
            from fixpack.engine import revert

            revert(engine, None)
            drift = []
            for s in steps:
                for rel in s["files"]:
                    pkg, sub = rel.split("/", 1)
                    from fixpack.hashing import sha256_file

                    if sha256_file(tree / rel) != manifest[pkg][sub]:
                        drift.append(rel)
            results.append({"fix": "(re-run)", "result": "ok" if rerun_noop in (True, None) else "FAILED", "detail": "second apply is a no-op" if rerun_noop else "n/a (partial chain)"})
            results.append({"fix": "(revert --all)", "result": "ok" if not drift else "FAILED", "detail": "pristine bytes restored" if not drift else f"not pristine: {drift}"})
            if not args.json:
                for r in results[-2:]:
                    print(f"{r['fix']}{'.' * max(3, 40 - len(r['fix']))}{r['result']:<9}        {r['detail']}")

    counts: dict[str, int] = {}
    for r in results:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    total = time.perf_counter() - t_start
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if args.json:
        emit_json({"profile": profile.name, "port": port.name if port else None, "results": results, "skipped_sources": skipped_packages, "seconds": round(total, 1)})
    else:
        print(f"\ncheck {profile.name}{' port ' + port.name if port else ''}: {summary} in {total:.0f}s")
        for pkg, why in skipped_packages.items():
            print(f"!!! {pkg} fixes were NOT checked: {why}")
    if counts.get("FAILED"):
        raise CheckFailed(f"{counts['FAILED']} fix(es) not proven")
    return 0
