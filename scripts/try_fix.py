"""Developer loop for one fix, before it is pinned: red on the tree before it, green after.

    .venv/bin/python scripts/try_fix.py fixes/<id> [--after fixes/<a> fixes/<b> ...] [--tree DIR]

Copies the release tree, applies the --after fixes (earlier in pack order) and then the
fix, each through the real worker process, and runs the fix's tests on both trees.
`fixpack check` is the real gate; this is only the inner loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fixpack.pack.pack import load_fix  # installed by scripts/setup.sh (`pip install -e .`)


def apply(fix_dir: Path, tree: Path, stage: Path) -> None:
    fix = load_fix(fix_dir.resolve())
    job = {"fix_dir": str(fix.dir), "kind": fix.kind, "stage_dir": str(stage), "check_idempotent": True, "targets": []}
    for i, t in enumerate(fix.targets):
        job["targets"].append({"rel": t.rel, "src": str(tree / t.rel), "out": str(stage / f"{i}.out")})
    r = subprocess.run([sys.executable, "-m", "fixpack.sandbox.worker"], input=json.dumps(job), capture_output=True, text=True)
    res = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"error": r.stderr[-2000:]}
    if "error" in res:
        sys.exit(f"{fix.id}: {res['error']}")
    for t in job["targets"]:
        # replace, never write into: the tree may be hard-linked to the read-only cache
        (tree / t["rel"]).unlink()
        shutil.copyfile(t["out"], tree / t["rel"])
    print(f"applied {fix.id}")


def run_tests(fix_dir: Path, tree: Path) -> int:
    fix = load_fix(fix_dir.resolve())
    env = dict(os.environ, FIXPACK_TREE=str(tree), PYTHONDONTWRITEBYTECODE="1")
    tests = [str(fix.dir / t) for t in fix.meta["tests"]]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fixpack.proofs.pytest_plugin", "-p", "no:cacheprovider", "-o", "addopts=", *tests], env=env).returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("fix")
    ap.add_argument("--after", nargs="*", default=[])
    ap.add_argument("--tree", default=os.environ.get("FIXPACK_DEV_TREE"), help="a pristine release tree (default: from the fixpack cache)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        stage = Path(tmp) / "stage"
        stage.mkdir()
        if a.tree:
            shutil.copytree(a.tree, tree)
        else:
            from fixpack.pack.pack import Pack, default_pack_root
            from fixpack.sources import sources

            sources.materialise(Pack(default_pack_root()).profile("v0.26.0").base["sources"], tree)
        for f in a.after:
            apply(Path(f), tree, stage)
        print("== before the fix (must FAIL)")
        red = run_tests(Path(a.fix), tree)
        apply(Path(a.fix), tree, stage)
        print("== after the fix (must PASS)")
        green = run_tests(Path(a.fix), tree)
        print(f"RESULT: before={'FAIL' if red else 'PASS'} after={'PASS' if green == 0 else 'FAIL'} -> {'RED/GREEN OK' if red and green == 0 else 'NOT PROVEN'}")


if __name__ == "__main__":
    main()
