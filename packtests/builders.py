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

from fixpack.kinds import CHANGE_FILES

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

CODEMOD_TWO = """
import libcst as cst
import libcst.matchers as m

from fixpack.kinds.codemod import Codemod

BY_POSITION = cst.parse_expression("[self.table[pos] for pos, _ in enumerate(ids)]")
PLACE = "the list Batch.rows returns"


class RowsByPosition(Codemod):
    DESCRIPTION = "Batch.rows reads rows by position, not by persistent index."
    TARGET = "pkg_a/sub/other.py"
    PLACES = (PLACE,)

    @m.call_if_inside(m.FunctionDef(name=m.Name("rows")))
    @m.leave(m.Return(value=m.ListComp()))
    def by_position(self, original, updated):
        done = m.matches(updated.value, m.ListComp(for_in=m.CompFor(iter=m.Call(func=m.Name("enumerate")))))
        return self.at(PLACE, updated, updated if done else updated.with_changes(value=BY_POSITION))
"""

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
    extra.setdefault("releases", {"test": {"status": "applies"}})  # the synthetic profile's name
    for k, v in extra.items():
        lines.append(f"{k}: {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def write_fix(root: Path, fid: str, kind: str, targets: list[str], change: str, **extra) -> Path:
    d = root / "fixes" / fid
    d.mkdir(parents=True, exist_ok=True)
    (d / "fix.yaml").write_text(fix_yaml(fid, kind, targets, **extra))
    (d / CHANGE_FILES[kind]).write_text(change)
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
    from fixpack.sources.release import tree_hashes

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
    from fixpack.pack.pack import Pack
    from fixpack.sources.release import build_lock, dump

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


def fixpack(
    *args: str,
    pack: Path | None = None,
    env: dict | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
    kernel_without: str | None = None,
) -> subprocess.CompletedProcess:
    """Run the CLI in its own process, as users do; ``kernel_without`` ("landlock", "seccomp")
    runs it as on a kernel without that (packtests.kernel_without)."""
    cmd = [sys.executable, "-m", "fixpack", *args]
    if kernel_without:
        cmd = [sys.executable, "-m", "packtests.kernel_without", kernel_without, *cmd]
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
    return subprocess.run(
        [sys.executable, str(REPO / "apply_all.py"), *args], capture_output=True, text=True, timeout=timeout, env=e
    )


# ---- reliability campaign helpers (appended; the functions above are shared by other tests)


def tree_digest(tree: Path, *, content: bool = True, skip: tuple[str, ...] = (".fixpack",)) -> dict[str, tuple]:
    """Every entry under ``tree`` (files, links, folders) with its kind, mode, owner and sha256.

    ``content=False`` records (inode, size, mtime) instead of the hash: cheap on a release tree,
    and still catches any rewrite, since fixpack replaces files by rename (a new inode).
    """
    import hashlib
    import stat as st

    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        rel_dir = Path(dirpath).relative_to(tree)
        dirnames[:] = sorted(d for d in dirnames if not (rel_dir == Path(".") and d in skip))
        for name in sorted(dirnames) + sorted(filenames):
            p = Path(dirpath) / name
            s = os.lstat(p)
            rel = (rel_dir / name).as_posix()
            if st.S_ISLNK(s.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif st.S_ISDIR(s.st_mode):
                out[rel] = ("dir", st.S_IMODE(s.st_mode), s.st_uid, s.st_gid)
            elif content:
                out[rel] = (
                    "file",
                    st.S_IMODE(s.st_mode),
                    s.st_uid,
                    s.st_gid,
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                )
            else:
                out[rel] = ("file", st.S_IMODE(s.st_mode), s.st_uid, s.st_gid, s.st_ino, s.st_size, s.st_mtime_ns)
    return out


def make_chain_pack(
    root: Path, *, n_files: int = 8, n_fixes: int = 7, files_per_fix: int = 4, codemod: bool = True, seed: int = 7
) -> Path:
    """A larger synthetic profile for kill sweeps: ``n_fixes`` multi-file fixes over ``n_files``
    modules of pkg_a/pkg_b, later fixes building on earlier ones (diffs made against the state
    the fixes before them leave), plus one codemod. Pristine tree in ``root/pristine``."""
    import difflib
    import random

    import yaml

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    src = root / "pristine"
    write_tree(src)
    files = [f"pkg_{'ab'[i % 2]}/chain_{i}.py" for i in range(n_files)]
    current = {}
    for i, rel in enumerate(files):
        text = "".join(f"value_{i}_{k} = {k}\n" for k in range(1, 41))
        (src / rel).write_text(text)
        current[rel] = text
    entries = []
    for j in range(n_fixes):
        fid = f"chain-{j:02d}"
        targets = sorted(rng.sample(files, min(files_per_fix, n_files)))
        parts = []
        for rel in targets:
            lines = current[rel].splitlines(keepends=True)
            k = rng.randrange(len(lines))
            lines[k] = lines[k].rstrip("\n") + f"  # {fid}\n"
            new = "".join(lines)
            parts.append(
                "".join(
                    difflib.unified_diff(
                        current[rel].splitlines(keepends=True), new.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
                    )
                )
            )
            current[rel] = new
        write_fix(root, fid, "diff", targets, "".join(parts))
        entries.append({"id": fid})
    if codemod:
        write_fix(root, "fix-two", "codemod", ["pkg_a/sub/other.py"], CODEMOD_TWO)
        entries.insert(len(entries) // 2, {"id": "fix-two"})
    (root / "profiles").mkdir(exist_ok=True)
    profile = {"name": "test", "base": {"sources": {}}, "packages": ["pkg_a", "pkg_b"], "fixes": entries}
    (root / "profiles" / "test.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return root


def forge_lock(pack_root: Path, fid: str, profile: str = "test") -> None:
    """Re-pin one fix's own hash in the lock after its files were replaced, keeping the pinned
    file states: the engine then runs the (changed) fix and must refuse what it produces."""
    from fixpack.pack.pack import load_fix

    path = pack_root / "profiles" / f"{profile}.lock.json"
    lock = json.loads(path.read_text())
    d = next(p for p in (pack_root / "fixes" / fid, *(pack_root / "ports").glob(f"*/fixes/{fid}")) if p.is_dir())
    fix = load_fix(d)
    lock["fixes"][fid]["hash"] = fix.content_hash()
    path.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")


def fault_fixpack(
    *args: str, pack: Path | None = None, faults: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """The CLI with injected faults (packtests/faultwrap.py reads FAULT_* from the environment)."""
    cmd = [sys.executable, "-m", "packtests.faultwrap", *args]
    if pack is not None:
        cmd += ["--pack", str(pack)]
    e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(REPO))
    e.update(faults or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=REPO)


def git_run(cwd: Path, *args: str) -> str:
    """git in ``cwd`` with a fixed identity; its stdout."""
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


def repo_of(tree: Path, dest: Path, packages: list[str], edit=None) -> str:
    """A git repository holding ``packages`` from ``tree`` (after ``edit``); returns its commit."""
    dest.mkdir(parents=True)
    for p in packages:
        shutil.copytree(tree / p, dest / p)
    if edit:
        edit(dest)
    git_run(dest, "init", "-q")
    git_run(dest, "add", "-A")
    git_run(dest, "commit", "-q", "-m", "snapshot")
    return git_run(dest, "rev-parse", "HEAD")


def stand_in_v030_pack(dev_tree: Path, tmp: Path) -> tuple[Path, dict[str, str]]:
    """A scratch pack whose v0.30.0 lock pins a stand-in for vllm-gaudi releases/v0.30.0.

    The committed lock pins vllm-gaudi only on its development base (the release commit is not
    fetchable here), and fixpack refuses an image pinned that way. The stand-in is the
    development base of ``dev_tree`` plus a file no fix touches, made a git repository, named by
    the scratch profile and pinned with `fixpack manifest` and `fixpack lock`. Returns the pack
    and the environment fixpack needs to use it (its own cache, offline)."""
    from fixpack.sources import sources

    release = repo_of(
        dev_tree,
        tmp / "stand-in",
        ["vllm_gaudi"],
        edit=lambda d: (d / "vllm_gaudi" / "STAND_IN.txt").write_text("stand-in\n"),
    )
    pack = tmp / "cookbook"
    shutil.copytree(REPO / "profiles", pack / "profiles")
    shutil.copy2(REPO / "apply_all.py", pack / "apply_all.py")  # apply_all finds its pack by realpath
    for name in ("fixpack", "fixes", "ports", "recipes"):
        (pack / name).symlink_to(REPO / name, target_is_directory=True)
    prof = pack / "profiles" / "v0.30.0.yaml"
    prof.write_text(prof.read_text().replace("      commit: 058f107\n", f"      commit: {release}\n", 1))
    cache = tmp / "cache"
    (cache / "trees").mkdir(parents=True)
    (cache / "trees" / "wheel-vllm-0.30.0").symlink_to(
        sources.cache_dir() / "trees" / "wheel-vllm-0.30.0", target_is_directory=True
    )
    env = {"FIXPACK_CACHE": str(cache), "FIXPACK_OFFLINE": "1"}
    for args in (
        ("sources", "add", "vllm-gaudi", str(tmp / "stand-in")),
        ("manifest", "--profile", "v0.30.0"),
        ("lock", "--profile", "v0.30.0"),
    ):
        proc = fixpack(*args, pack=None if args[0] == "sources" else pack, env=env, timeout=900)
        if proc.returncode != 0:
            raise AssertionError(
                f"fixpack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
    return pack, env


# Chains deep_chain made: a chain left in a test's tmp_path would crash the clean-up of every later
# pytest session on the machine (pytest removes old basetemps with shutil.rmtree, which recurses).
DEEP_CHAINS: list[Path] = []


def deep_chain(top: Path, depth: int, name: str = "d") -> Path:
    """``depth`` nested folders ``name`` under ``top``, made one level at a time through
    descriptors (a path that long is more than the kernel takes in one call), with an empty file
    ``bottom`` in the last; returns the first folder's path. A tree this deep crashes
    `shutil.rmtree` (it recurses): remove it with `remove_tree`."""
    DEEP_CHAINS.append(top / name)  # removed after the test even when it fails half-way (tests/conftest.py)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    return top / name


def remove_tree(path: Path) -> None:
    """Remove ``path`` at any depth (fixpack.apply.dirfd.remove_tree_at), if it is there: what a
    test that made a deep chain leaves for pytest's own clean-up, which recurses."""
    from fixpack.apply.dirfd import remove_tree_at

    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_tree_at(fd, path.name)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)
