"""Engine speed on the real v0.26.0 targets, as ratios to `python3 -c pass` measured in the same run.

    .venv/bin/python bench/bench_engine.py [--repeat 5]

(fixpack itself imports as installed by scripts/setup.sh: `pip install -e .`)

cold apply  : `python apply_all.py --profile v0.26.0 --root T` on a fresh pristine tree
              (each fix's process sealed by the kernel where it can be: Landlock and the
              seccomp metadata filter; the driver then compares the trees once per run)
cold, no LL : the same with FIXPACK_SANDBOX=hook: no kernel walls, so the driver keeps the
              bytes of every file of the trees and compares them after every fix
snapshot    : one scan of the package folders and the state folder (sealed: two per run;
              otherwise one before the first fix and one after each)
warm re-run : the same command again (already applied: hashing only)
verify      : `fixpack verify --profile v0.26.0 --root T`
Goals: cold apply <= 45x start-up (both rows); warm re-run and verify <= 3x start-up. The table
prints each ratio and whether its goal is met.

fixpack's own modules are byte-compiled first, as `pip install` leaves them in an image; the
commands then run with PYTHONDONTWRITEBYTECODE=1 so that nothing else is written.
The cold apply's own status lines give each fix's seconds; the slowest are printed after the table.
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
COLD_GOAL, WARM_GOAL = 45, 3  # x the interpreter's start-up


def timed(cmd: list[str], env=None, per_fix: dict | None = None) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    if per_fix is not None:  # "<fix>.....applied   <files>  0.23s"
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) > 2 and "applied" in parts[0] and parts[-1].endswith("s"):
                per_fix.setdefault(parts[0].split(".")[0], []).append(float(parts[-1][:-1]))
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", default="v0.26.0")
    a = ap.parse_args()
    from fixpack.pack.pack import Pack
    from fixpack.sources import sources

    pack = Pack(REPO)
    profile = pack.profile(a.profile)
    lock = json.loads(profile.lock_path.read_text())
    nfix = len(next(s for s in lock["selections"] if s["key"] == "-|")["steps"])
    py = sys.executable
    subprocess.run([py, "-m", "compileall", "-q", str(REPO / "fixpack")], check=True)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    startup, cold, cold_hook, warm, verify, scans = [], [], [], [], [], []
    from fixpack.sandbox.landlock import Unavailable, abi_version
    from fixpack.sandbox.watch import scan

    try:
        kernel = f"Landlock ABI {abi_version()}"
    except Unavailable as exc:
        kernel = f"no Landlock ({exc})"
    walls = ""
    per_fix: dict[str, list[float]] = {}
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            tree = sources.materialise(profile.base["sources"], Path(tmp) / "tree")
            startup.append(timed([py, "-c", "pass"]))
            cold.append(timed([py, str(REPO / "apply_all.py"), "--profile", a.profile, "--root", str(tree)], env, per_fix))
            if not walls:
                from fixpack.sandbox.runner import protection_text

                walls = protection_text(json.loads((tree / ".fixpack" / "state.json").read_text())["protection"])
            warm.append(timed([py, str(REPO / "apply_all.py"), "--profile", a.profile, "--root", str(tree)], env))
            verify.append(timed([str(Path(py).parent / "fixpack"), "verify", "--profile", a.profile, "--root", str(tree)], env))
            roots = [tree / p for p in profile.packages] + [tree / ".fixpack"]
            t0 = time.perf_counter()
            entries = len(scan(roots, set()))
            scans.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory() as tmp:
            tree = sources.materialise(profile.base["sources"], Path(tmp) / "tree")
            cold_hook.append(timed([py, str(REPO / "apply_all.py"), "--profile", a.profile, "--root", str(tree)], dict(env, FIXPACK_SANDBOX="hook")))
    s = statistics.median(startup)
    rows = [
        ("python3 -c pass", statistics.median(startup), 1.0, ""),
        (f"cold apply ({nfix} fixes)", statistics.median(cold), statistics.median(cold) / s, f"<= {COLD_GOAL}x"),
        (f"cold apply, Landlock off ({nfix} fixes)", statistics.median(cold_hook), statistics.median(cold_hook) / s, f"<= {COLD_GOAL}x"),
        (f"one snapshot ({entries} entries)", statistics.median(scans), statistics.median(scans) / s, ""),
        ("warm re-run", statistics.median(warm), statistics.median(warm) / s, f"<= {WARM_GOAL}x"),
        ("verify", statistics.median(verify), statistics.median(verify) / s, f"<= {WARM_GOAL}x"),
    ]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "unknown CPU")
    print(f"median of {a.repeat} runs, real v0.26.0 targets, {os.cpu_count()} CPUs ({cpu}), load {os.getloadavg()[0]:.1f}; kernel: {kernel}; cold apply's fix processes: {walls}")
    print("| what | seconds | x start-up | goal | met |")
    print("|---|---|---|---|---|")
    for name, sec, ratio, goal in rows:
        met = "" if not goal else ("yes" if ratio <= float(goal.strip("<= x")) else "no")
        print(f"| {name} | {sec:.3f} | {ratio:.1f} | {goal} | {met} |")
    med = sorted(((statistics.median(v), k) for k, v in per_fix.items()), reverse=True)
    total = sum(m for m, _ in med)
    print(f"cold apply, seconds per fix as its status line reports them (median): all {len(med)} fixes {total:.2f} s; slowest:")
    print("  " + ", ".join(f"{k} {m:.2f}" for m, k in med[:6]))


if __name__ == "__main__":
    main()
