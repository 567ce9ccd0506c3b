"""What reused proofs save in `fixpack check` (the goals of docs/ci.md): one profile checked three
times in one run, against one empty proof ledger.

    .venv/bin/python bench/bench_check_reuse.py [--profile v0.26.0] [--port NAME] [--fix ID]

cold     : `fixpack check` with an empty ledger: every fix proven (what a check cost before reuse,
           plus computing the keys);
unchanged: the same check again: every proof reused (the chain is still applied, the re-run and
           revert rows still run);
one fix  : a copy of the pack with one comment line added to one fix's test file: that fix is
           proven again, every other one reused.
The goals: unchanged within 30 s, one fix within 120 s, cold no slower than the check was before
reuse (the cold run's 'reuse' phase is the keys' cost, printed beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def check(pack: Path, ledger: Path, profile: str, port: str | None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "fixpack", "check", "--pack", str(pack), "--profile", profile, "--json"]
    if port:
        cmd += ["--port", port]
    env = dict(os.environ, FIXPACK_PROOF_CACHE=str(ledger))
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    secs = time.perf_counter() - t0
    if r.returncode not in (0, 9) or not r.stdout.strip():
        sys.exit(f"fixpack check failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return secs, json.loads(r.stdout)


def summary(data: dict) -> str:
    fixes = [r for r in data["results"] if "tests" in r]
    reused = sum(1 for r in fixes if r["proof"]["reused"])
    results = {r["result"] for r in fixes}
    return f"{len(fixes)} fixes ({reused} reused, {len(fixes) - reused} proven; results {', '.join(sorted(results))})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="v0.26.0")
    ap.add_argument("--port")
    ap.add_argument("--fix", help="the fix whose test file gets the comment (default: the profile's last)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-check-reuse-") as d:
        work = Path(d)
        files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
        pack = work / "pack"
        for rel in files:
            (pack / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, pack / rel)
        ledger = work / "ledger"
        cold, data = check(pack, ledger, args.profile, args.port)
        print(f"cold      {cold:7.1f} s  {summary(data)}; phases {data['phase_seconds']}", flush=True)
        warm, data2 = check(pack, ledger, args.profile, args.port)
        print(f"unchanged {warm:7.1f} s  {summary(data2)}", flush=True)
        fixes = [r["fix"] for r in data["results"] if "tests" in r]
        target = args.fix or fixes[-1]
        from fixpack.pack.pack import Pack

        the_pack = Pack(pack)
        port = the_pack.port(args.port) if args.port else None
        fix = the_pack.fix(target, port=port)
        test = fix.dir / fix.meta["tests"][0]
        with open(test, "a") as f:
            f.write("\n# a comment: the proof key changes, the proof is made again\n")
        one, data3 = check(pack, ledger, args.profile, args.port)
        again = [r["fix"] for r in data3["results"] if "tests" in r and not r["proof"]["reused"]]
        print(f"one fix   {one:7.1f} s  {summary(data3)}; proven again: {', '.join(again)}", flush=True)
        print(
            f"\nratios: unchanged/cold {warm / cold:.3f}, one fix/cold {one / cold:.3f}; "
            f"goals: unchanged <= 30 s ({'met' if warm <= 30 else 'NOT met'}), "
            f"one fix <= 120 s ({'met' if one <= 120 else 'NOT met'})"
        )
        print(f"machine: {data['machine']}")


if __name__ == "__main__":
    main()
