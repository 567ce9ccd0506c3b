"""The codemod kind's two costs on a cold apply, each measured side by side in one run.

    .venv/bin/python bench/bench_codemods.py [--repeat 7]

import : a fresh `python` importing the codemod kind (libcst and its matchers) as the codemod
         fork server does (fixpack.forkserver._import_codemod_kind: no docstrings rendered from
         the matchers' signatures), and as a plain `import fixpack.kinds.codemod`
codemod: each codemod of the pack on its target in the pinned v0.26.0 release (from the source
         cache), its SCOPE's lines given as the lock gives them, with the node-type gate
         (fixpack.kinds.codemod._node_types) and without it (every node through libcst's own
         matcher dispatch); the outputs of both are compared too
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

IMPORT = {
    "as the codemod server does": "import fixpack.forkserver as f; f._import_codemod_kind()",
    "plain import": "import fixpack.forkserver; import fixpack.kinds.codemod",
}


def import_seconds(code: str) -> float:
    timed = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
    r = subprocess.run([sys.executable, "-c", timed], capture_output=True, text=True, cwd=REPO, check=True)
    return float(r.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from fixpack import sources
    from fixpack.kinds import codemod
    from fixpack.pack import Pack

    rows = []
    for _ in range(2):  # the first round warms the page cache
        times: dict[str, list[float]] = {k: [] for k in IMPORT}
        for _ in range(a.repeat):
            for name, code in IMPORT.items():  # interleaved, so that both see the same load
                times[name].append(import_seconds(code))
    fast, plain = (statistics.median(times[k]) for k in IMPORT)
    rows.append(("import the codemod kind", fast, plain))

    profile = Pack(REPO).profile("v0.26.0")
    node_types = codemod._node_types
    with tempfile.TemporaryDirectory() as tmp:
        tree = sources.materialise(profile.base["sources"], Path(tmp) / "tree")
        for path in CODEMODS:
            classes = codemod.load(path.parent)
            (rel,) = {c.TARGET for c in classes}
            text = (tree / rel).read_text()
            located: dict = {}
            codemod.transform(classes, rel, text, located=located)  # the SCOPE lines, as the lock keeps them
            out: dict[bool, str] = {}
            secs: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(a.repeat):
                for gate in (True, False):
                    codemod._node_types = node_types if gate else (lambda _c: None)
                    t0 = time.perf_counter()
                    out[gate] = codemod.transform(classes, rel, text, known=located)
                    secs[gate].append(time.perf_counter() - t0)
            codemod._node_types = node_types
            if out[True] != out[False]:
                sys.exit(f"{path.parent.name}: the gate changes the output")
            rows.append((f"codemod {path.parent.name}", statistics.median(secs[True]), statistics.median(secs[False])))

    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        "unknown CPU",
    )
    print(f"median of {a.repeat}, {sys.version.split()[0]}, {cpu}, load {os.getloadavg()[0]:.1f}")
    print("| what | as fixpack runs it | without the measure | ratio |")
    print("|---|---|---|---|")
    for name, new, old in rows:
        print(f"| {name} | {new * 1000:.1f} ms | {old * 1000:.1f} ms | {new / old:.2f} |")
    print("(import: without = a plain import, docstrings rendered; codemod: without = no node-type gate; same output)")


if __name__ == "__main__":
    main()
