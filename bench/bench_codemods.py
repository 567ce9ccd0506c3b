"""What the codemod kind costs a cold apply: libcst's import and each codemod's visit.

    .venv/bin/python bench/bench_codemods.py [--repeat 7]

python -c pass: the interpreter's start-up, the unit of the engine's goals (bench/bench_engine.py)
import        : a fresh `python` importing the codemod kind (libcst and its matchers), as the
                codemod fork server does before its first job
codemod       : each codemod of the pack on its target in the pinned v0.26.0 release (from the
                source cache), its SCOPE's lines given as the lock gives them, in this process
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

REPO = Path(__file__).resolve().parent.parent
CODEMODS = sorted([*REPO.glob("fixes/*/codemod.py"), *REPO.glob("ports/*/fixes/*/codemod.py")])


def process_seconds(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    return time.perf_counter() - t0


def import_seconds() -> float:
    timed = "import time; t = time.perf_counter(); import fixpack.kinds.codemod; print(time.perf_counter() - t)"
    r = subprocess.run([sys.executable, "-c", timed], capture_output=True, text=True, cwd=REPO, check=True)
    return float(r.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    from fixpack.kinds import codemod
    from fixpack.pack.pack import Pack
    from fixpack.sources import sources

    startup: list[float] = []
    imports: list[float] = []
    for _ in range(2):  # the first round warms the page cache
        startup, imports = [], []
        for _ in range(a.repeat):  # interleaved, so that both see the same load
            startup.append(process_seconds("pass"))
            imports.append(import_seconds())
    s = statistics.median(startup)
    rows = [("python -c pass", s), ("import the codemod kind (a fresh process)", statistics.median(imports))]

    profile = Pack(REPO).profile("v0.26.0")
    with tempfile.TemporaryDirectory() as tmp:
        tree = sources.materialise(profile.base["sources"], Path(tmp) / "tree")
        for path in CODEMODS:
            classes = codemod.load(path.parent)
            (rel,) = {c.TARGET for c in classes}
            text = (tree / rel).read_text()
            located: dict = {}
            codemod.transform(classes, rel, text, located=located)  # the SCOPE lines, as the lock keeps them
            secs = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                codemod.transform(classes, rel, text, known=located)
                secs.append(time.perf_counter() - t0)
            rows.append((f"codemod {path.parent.name}", statistics.median(secs)))

    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        "unknown CPU",
    )
    print(
        f"median of {a.repeat}, {sys.version.split()[0]}, {os.cpu_count()} CPUs ({cpu}), load {os.getloadavg()[0]:.1f}"
    )
    print("| what | ms | x start-up |")
    print("|---|---|---|")
    for name, sec in rows:
        print(f"| {name} | {sec * 1000:.1f} | {sec / s:.2f} |")


if __name__ == "__main__":
    main()
