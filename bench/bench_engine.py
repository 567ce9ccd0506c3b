"""Engine speed on the real v0.26.0 targets, as ratios to `python3 -c pass` measured in the same run.

    .venv/bin/python bench/bench_engine.py [--repeat 5]

cold apply  : `python apply_all.py --profile v0.26.0 --root T` on a fresh pristine tree
warm re-run : the same command again (already applied: hashing only)
verify      : `fixpack verify --profile v0.26.0 --root T`
Goals: warm re-run and verify <= 3x start-up; cold apply <= 2 x (number of fixes) x start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def timed(cmd: list[str], env=None) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", default="v0.26.0")
    a = ap.parse_args()
    from fixpack import sources
    from fixpack.pack import Pack

    pack = Pack(REPO)
    profile = pack.profile(a.profile)
    lock = json.loads(profile.lock_path.read_text())
    nfix = len(next(s for s in lock["selections"] if s["key"] == "-|")["steps"])
    py = sys.executable
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    startup, cold, warm, verify = [], [], [], []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            tree = sources.materialise(profile.base["sources"], Path(tmp) / "tree")
            startup.append(timed([py, "-c", "pass"]))
            cold.append(timed([py, str(REPO / "apply_all.py"), "--profile", a.profile, "--root", str(tree)], env))
            warm.append(timed([py, str(REPO / "apply_all.py"), "--profile", a.profile, "--root", str(tree)], env))
            verify.append(timed([str(Path(py).parent / "fixpack"), "verify", "--profile", a.profile, "--root", str(tree)], env))
    s = statistics.median(startup)
    rows = [
        ("python3 -c pass", statistics.median(startup), 1.0, ""),
        (f"cold apply ({nfix} fixes)", statistics.median(cold), statistics.median(cold) / s, f"<= {2 * nfix}x"),
        ("warm re-run", statistics.median(warm), statistics.median(warm) / s, "<= 3x"),
        ("verify", statistics.median(verify), statistics.median(verify) / s, "<= 3x"),
    ]
    print(f"median of {a.repeat} runs, real v0.26.0 targets, {os.cpu_count()} CPUs")
    print(f"| what | seconds | x start-up | goal | met |")
    print(f"|---|---|---|---|---|")
    for name, sec, ratio, goal in rows:
        met = "" if not goal else ("yes" if ratio <= float(goal.strip("<= x")) else "no")
        print(f"| {name} | {sec:.3f} | {ratio:.1f} | {goal} | {met} |")


if __name__ == "__main__":
    main()
