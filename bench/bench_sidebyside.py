"""Two copies of fixpack side by side in one run: cold apply, warm re-run and verify on the real
v0.26.0 targets, interleaved (the order flips each round), as ratios to `python3 -c pass`.

    git archive BASE_COMMIT | tar -x -C /tmp/base
    .venv/bin/python bench/bench_sidebyside.py /tmp/base . [--repeat 15]

Each copy runs with its own fixpack first on PYTHONPATH (the fork servers put their own copy
first too). On a machine shared with other work the cold apply swings with the load: compare
the two columns of one run, never figures of different runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_model() -> str:
    """The CPU the figures were measured on (/proc/cpuinfo's model name, else the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--profile", default="v0.26.0")
    a = ap.parse_args()
    variants = {"base": a.base.resolve(), "new": a.new.resolve()}
    sys.path.insert(0, str(variants["new"]))
    from fixpack.pack.pack import Pack
    from fixpack.sources import sources

    profile = Pack(variants["new"]).profile(a.profile)
    py = sys.executable
    for repo in variants.values():
        subprocess.run([py, "-m", "compileall", "-q", str(repo / "fixpack")], check=True)
    res: dict = {k: {"cold": [], "warm": [], "verify": []} for k in variants}
    startup = []
    for i in range(a.repeat):
        order = list(variants.items()) if i % 2 == 0 else list(variants.items())[::-1]
        for name, repo in order:
            env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(repo))
            with tempfile.TemporaryDirectory() as tmp:
                tree = sources.materialise(profile.base["sources"], Path(tmp) / "tree")
                startup.append(timed([py, "-c", "pass"], env))
                apply = [py, str(repo / "apply_all.py"), "--profile", a.profile, "--root", str(tree)]
                res[name]["cold"].append(timed(apply, env))
                res[name]["warm"].append(timed(apply, env))
                verify = [
                    py,
                    "-m",
                    "fixpack",
                    "verify",
                    "--profile",
                    a.profile,
                    "--root",
                    str(tree),
                    "--pack",
                    str(repo),
                ]
                res[name]["verify"].append(timed(verify, env))
    s = statistics.median(startup)
    print(
        f"median of {a.repeat} runs each, interleaved; python -c pass {s:.3f} s; load {os.getloadavg()[0]:.1f}; "
        f"{os.cpu_count()} CPUs: {cpu_model()}"
    )
    print("| what | base s | base x start-up | new s | new x start-up | new / base |")
    print("|---|---|---|---|---|---|")
    for k in ("cold", "warm", "verify"):
        b, n = statistics.median(res["base"][k]), statistics.median(res["new"][k])
        print(f"| {k} | {b:.3f} | {b / s:.1f} | {n:.3f} | {n / s:.1f} | {n / b:.3f} |")


if __name__ == "__main__":
    main()
