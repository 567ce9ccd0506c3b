"""Reusable builders for engine tests: a synthetic pack (fixes, profile, lock) and its tree.

The synthetic packages stand in for vllm and vllm_gaudi so every engine behaviour can be
shown in milliseconds; tests on the real release files live in test_real_release.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MOD_A = "".join(f"line_{i} = {i}\n" for i in range(1, 31))
OTHER = textwrap.dedent(
    '''\
    """A module that a codemod edits."""


    class Batch:
        def rows(self, ids):
            # keyed by persistent index
            return [self.table[i] for i in ids]

        def size(self):
            return len(self.table)


    def helper(x):
        return x + 1
    '''
)
X_B = "alpha\nbeta\ngamma\n"

DIFF_ONE = """--- a/pkg_a/mod.py
+++ b/pkg_a/mod.py
@@ -9,7 +9,7 @@
 line_9 = 9
 line_10 = 10
 line_11 = 11
-line_12 = 12
+line_12 = 12  # fixed
 line_13 = 13
 line_14 = 14
 line_15 = 15
"""

CODEMOD_TWO = '''
from fixpack.codemod import Rewrite, replace_once


class RowsByPosition(Rewrite):
    target = "pkg_a/sub/other.py"
    nodes = ["Batch.rows"]

    def rewrite(self, qualname, node):
        return replace_once(node, "return [self.table[i] for i in ids]", "return [self.table[pos] for pos, _ in enumerate(ids)]")
'''

DIFF_OPT = """--- a/pkg_b/x.py
+++ b/pkg_b/x.py
@@ -1,3 +1,3 @@
 alpha
-beta
+BETA
 gamma
"""

# A later fix on the same file as fix-one, made against fix-one's output.
DIFF_THREE = """--- a/pkg_a/mod.py
+++ b/pkg_a/mod.py
@@ -26,5 +26,5 @@
 line_26 = 26
 line_27 = 27
 line_28 = 28
-line_29 = 29
+line_29 = 29  # fixed
 line_30 = 30
"""


def fix_yaml(fid: str, kind: str, targets: list[str], **extra) -> str:
    lines = [
        f"id: {fid}",
        f"summary: synthetic fix {fid}",
        "why: a synthetic defect for engine tests",
        f"kind: {kind}",
        "targets:",
    ]
    for t in targets:
        pkg, path = t.split("/", 1)
        lines += [f"  - package: {pkg}", f"    path: {path}"]
    lines += ["upstream: null", "remove_when: never (test fixture)", "tests: [test_it.py]"]
    for k, v in extra.items():
        lines.append(f"{k}: {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def write_fix(root: Path, fid: str, kind: str, targets: list[str], change: str, **extra) -> Path:
    d = root / "fixes" / fid
    d.mkdir(parents=True, exist_ok=True)
    (d / "fix.yaml").write_text(fix_yaml(fid, kind, targets, **extra))
    (d / ("patch.diff" if kind == "diff" else "codemod.py")).write_text(change)
    (d / "test_it.py").write_text("def test_placeholder(tree):\n    assert tree.is_dir()\n")
    return d


def write_tree(root: Path) -> Path:
    (root / "pkg_a" / "sub").mkdir(parents=True, exist_ok=True)
    (root / "pkg_b").mkdir(parents=True, exist_ok=True)
    (root / "pkg_a" / "__init__.py").write_text("")
    (root / "pkg_a" / "mod.py").write_text(MOD_A)
    (root / "pkg_a" / "sub" / "__init__.py").write_text("")
    (root / "pkg_a" / "sub" / "other.py").write_text(OTHER)
    (root / "pkg_b" / "__init__.py").write_text("")
    (root / "pkg_b" / "x.py").write_text(X_B)
    return root


def hashes(tree: Path) -> dict[str, dict[str, str]]:
    from fixpack.release import tree_hashes

    return tree_hashes(tree, ["pkg_a", "pkg_b"])


def make_pack(root: Path, *, fixes: list[dict] | None = None, with_three: bool = False) -> Path:
    """A pack with fix-one (diff), fix-two (codemod), fix-opt (opt-in diff), optionally fix-three."""
    root.mkdir(parents=True, exist_ok=True)
    write_fix(root, "fix-one", "diff", ["pkg_a/mod.py"], DIFF_ONE)
    write_fix(root, "fix-two", "codemod", ["pkg_a/sub/other.py"], CODEMOD_TWO)
    write_fix(root, "fix-opt", "diff", ["pkg_b/x.py"], DIFF_OPT)
    entries = fixes or [{"id": "fix-one"}, {"id": "fix-two"}, {"id": "fix-opt", "opt_in": True}]
    if with_three:
        write_fix(root, "fix-three", "diff", ["pkg_a/mod.py"], DIFF_THREE)
        entries = entries + [{"id": "fix-three"}]
    (root / "profiles").mkdir(exist_ok=True)
    profile = {"name": "test", "base": {"sources": {}}, "packages": ["pkg_a", "pkg_b"], "fixes": entries}
    import yaml

    (root / "profiles" / "test.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return root


def pristine_source(root: Path) -> Path:
    src = root / "pristine"
    if not src.exists():
        write_tree(src)
    return src


def write_lock(pack_root: Path) -> Path:
    """Generate the synthetic profile's manifest and lock from its pristine tree."""
    from fixpack.pack import Pack
    from fixpack.release import build_lock, dump

    src = pristine_source(pack_root)
    pack = Pack(pack_root)
    profile = pack.profile("test")
    manifest = hashes(src)
    profile.manifest_path.write_text(dump({"profile": "test", "files": manifest}))

    def make_tree(dest: Path) -> Path:
        shutil.copytree(src, dest / "tree")
        return dest / "tree"

    profile.lock_path.write_text(dump(build_lock(pack, profile, manifest, make_tree)))
    return profile.lock_path


def new_tree(pack_root: Path, dest: Path) -> Path:
    shutil.copytree(pristine_source(pack_root), dest)
    return dest


def fixpack(*args: str, pack: Path | None = None, env: dict | None = None, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in its own process, as users do."""
    cmd = [sys.executable, "-m", "fixpack", *args]
    if pack is not None and args and args[0] not in ("sources",):
        cmd += ["--pack", str(pack)]
    e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    e["PYTHONPATH"] = str(REPO)
    if env:
        e.update(env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd or REPO)


def apply_all(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if env:
        e.update(env)
    return subprocess.run([sys.executable, str(REPO / "apply_all.py"), *args], capture_output=True, text=True, timeout=timeout, env=e)
