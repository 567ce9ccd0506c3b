"""A restore never writes through a folder swapped during the run (issue 30, cases 3 and 4).

Whoever owns the package folders can, while fixpack runs as root, replace a folder of the tree
by a symlink to a root-owned folder elsewhere. The driver's put-back then must not create,
chmod or write anything there: each write is made through descriptors walked from the package
folder without following a symlink (fixpack/apply/dirfd.py), the change is named ("PATH: a parent
was replaced during the run; nothing was restored through it") and the run exits 6.
"""

from __future__ import annotations

import os
import stat

import pytest

from packtests import builders as B
from packtests import reliability_lib as L
from packtests.hostile_cases import Ctx
from packtests.sandbox_cases import PRELUDE, landlock_here

MSG = "{path}: a parent was replaced during the run; nothing was restored through it"


def _outside(tmp_path):
    """A root-owned folder outside the tree, holding a file of the same name as the tree's."""
    out = tmp_path / "outside" / "rootdir"
    out.mkdir(parents=True)
    (out / "other.py").write_text("root_owned = True\n")
    os.chmod(out / "other.py", 0o600)
    return out


def _state(folder):
    return {
        p.name: (p.read_bytes() if p.is_file() else None, stat.S_IMODE(p.lstat().st_mode), p.lstat().st_uid)
        for p in sorted(folder.parent.rglob("*"))
    }


@pytest.mark.parametrize("mode", ["landlock", "hook"])
def test_another_process_swaps_a_folder_made_during_the_run_for_a_symlink(tmp_path, mode):
    """Case 3 (sealed) and the same with the kernel layers forced off: a folder of the tree
    (with a mode-0777 folder in it) is swapped for a symlink to a root-owned folder while the
    run goes on; putting back the inner folder would create it there."""
    if mode == "landlock" and landlock_here():
        pytest.skip(f"no Landlock here: {landlock_here()}")
    root, tree = L.copy_pack("basic", tmp_path)
    inner = tree / "pkg_b" / "d" / "e"
    inner.mkdir(parents=True)
    os.chmod(inner, 0o777)
    (inner / "y.py").write_text("y = 1\n")
    out = _outside(tmp_path)
    outside_before = _state(out)
    r = B.fault_fixpack(
        "apply", "--profile", "test", "--root", str(tree), pack=root,
        faults={"FAULT_AT_LABEL": "state written for apply fix-one", "FAULT_ACTION": f"swapdir:{tree / 'pkg_b' / 'd'}",
                "FAULT_LINK_TO": str(out), "FIXPACK_SANDBOX": "auto" if mode == "landlock" else "hook"},
    )  # fmt: skip
    text = r.stdout + r.stderr
    assert r.returncode == 6, text
    assert MSG.format(path=inner) in text, text
    assert _state(out) == outside_before, "something was created or changed outside the tree"
    assert not (out / "e").exists()
    if mode == "landlock":  # sealed: no fix's process can have made it
        assert "another process changed the tree during the run" in text, text
    else:
        assert "its process, or another process" in text, text


def test_a_fix_that_swaps_its_folder_for_a_symlink_gets_no_write_outside_without_the_kernel(tmp_path):
    """Case 4 (FIXPACK_SANDBOX=hook, the path of a kernel without Landlock): the fix's process
    changes a tree file, then swaps its folder for a symlink to a folder holding a root-owned
    file of the same name. The put-back of the kept bytes must not land in that file."""
    root, tree = L.copy_pack("codemod-first", tmp_path)
    out = _outside(tmp_path)
    outside_before = _state(out)
    ctx = Ctx(root, tree, tmp_path / "outside", tmp_path / "outside" / "pwned")
    body = (
        PRELUDE.strip("\n")
        + "\nfd = libc.open(T + b'/pkg_a/sub/other.py', os.O_WRONLY | os.O_APPEND)\nif fd < 0: fail('open')\nos.write(fd, b'# pwned\\n')"
        + "\nif libc.rename(T + b'/pkg_a/sub', T + b'/pkg_a/sub-moved') != 0: fail('rename')"
        + f"\nif libc.symlink({str(out).encode()!r}, T + b'/pkg_a/sub') != 0: fail('symlink')"
        + "\nreturn node"
    )
    ctx.codemod(body, fid="fix-two", target="pkg_a/sub/other.py")
    B.forge_lock(root, "fix-two")
    r = B.fixpack(
        "apply",
        "--profile",
        "test",
        "--root",
        str(tree),
        pack=root,
        env={"FIXPACK_TEST_TREE": str(tree), "FIXPACK_SANDBOX": "hook"},
    )
    text = r.stdout + r.stderr
    assert r.returncode == 6, text
    assert MSG.format(path=tree / "pkg_a" / "sub" / "other.py") in text, text
    assert "fix fix-two" in text and "its process, or another process" in text
    assert _state(out) == outside_before, "the root-owned file outside the tree was written"
    assert (out / "other.py").read_text() == "root_owned = True\n"
    # the rest of the tree is as it was: nothing of the fix was written
    assert (tree / "pkg_a" / "mod.py").read_bytes() == (root / "pristine" / "pkg_a" / "mod.py").read_bytes()


def test_a_commit_never_writes_through_a_package_folder_swapped_for_a_symlink(tmp_path):
    """The same attack on the driver's own commit: the package folder is swapped, after the
    journal is written, for a symlink to a folder holding a copy of the pristine target (so
    that its hash still matches). The rename into place is made through descriptors walked
    without following a symlink: refused, exit 6, and the copy outside is not replaced."""
    root, tree = L.copy_pack("basic", tmp_path)
    out = tmp_path / "outside" / "rootdir"
    out.mkdir(parents=True)
    for name in ("__init__.py", "mod.py"):
        (out / name).write_bytes((tree / "pkg_a" / name).read_bytes())
    os.chmod(out / "mod.py", 0o600)
    outside_before = _state(out)
    r = B.fault_fixpack(
        "apply", "--profile", "test", "--root", str(tree), pack=root,
        faults={"FAULT_AT_LABEL": "journal written for apply fix-one", "FAULT_ACTION": f"swapdir:{tree / 'pkg_a'}", "FAULT_LINK_TO": str(out)},
    )  # fmt: skip
    text = r.stdout + r.stderr
    assert r.returncode == 6, text
    assert (
        f"{tree / 'pkg_a' / 'mod.py'}: a parent was replaced during the run; nothing was written through it" in text
    ), text
    assert _state(out) == outside_before, "the file outside the tree was replaced"


def test_stale_bytecode_is_never_removed_through_a_pycache_symlink(tmp_path):
    """A `__pycache__` planted as a symlink to a folder elsewhere: the driver's removal of the
    rewritten module's stale bytecode would unlink files there. Refused, exit 6."""
    root, tree = L.copy_pack("basic", tmp_path)
    out = tmp_path / "outside" / "cache"
    out.mkdir(parents=True)
    victim = out / "mod.cpython-311.pyc"
    victim.write_bytes(b"not yours")
    (tree / "pkg_a" / "__pycache__").symlink_to(out)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    text = r.stdout + r.stderr
    assert r.returncode == 6, text
    assert (
        f"{tree / 'pkg_a' / '__pycache__'}: a parent was replaced during the run; nothing was removed through it"
        in text
    ), text
    assert victim.read_bytes() == b"not yours"
    # the commit was rolled back: the target is pristine again
    assert (tree / "pkg_a" / "mod.py").read_bytes() == (root / "pristine" / "pkg_a" / "mod.py").read_bytes()


def test_a_state_folder_that_is_a_symlink_or_not_ours_is_refused(tmp_path):
    """fixpack writes its state and backups only into a real folder owned by its own user that
    no one else may write: a `.fixpack` planted as a symlink to a folder elsewhere, or made by
    someone else, is refused before anything is written (exit 6)."""
    root, tree = L.copy_pack("basic", tmp_path)
    out = tmp_path / "outside" / "etc"
    out.mkdir(parents=True)
    (tree / ".fixpack").symlink_to(out)
    before = B.tree_digest(tree)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 6 and f"{tree / '.fixpack'}: the state folder is a symlink" in r.stderr, r.stdout + r.stderr
    assert list(out.iterdir()) == [] and B.tree_digest(tree) == before
    (tree / ".fixpack").unlink()
    (tree / ".fixpack").mkdir()
    os.chmod(tree / ".fixpack", 0o777)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 6 and "that no one else may write" in r.stderr, r.stdout + r.stderr
    assert B.tree_digest(tree) == before


def test_a_state_folder_swapped_during_the_run_gets_no_write(tmp_path):
    """The folder's owner swaps `.fixpack` for a symlink after the journal is written: every
    later write of the state goes through the descriptor opened at the start, never into the
    symlink's target."""
    root, tree = L.copy_pack("basic", tmp_path)
    out = tmp_path / "outside" / "etc"
    out.mkdir(parents=True)
    r = B.fault_fixpack(
        "apply", "--profile", "test", "--root", str(tree), pack=root,
        faults={"FAULT_AT_LABEL": "journal written for apply fix-one", "FAULT_ACTION": f"swapdir:{tree / '.fixpack'}", "FAULT_LINK_TO": str(out)},
    )  # fmt: skip
    assert list(out.iterdir()) == [], "a state file was written through the symlink: " + r.stdout + r.stderr
    # fix-one's commit went on into the folder the run opened (moved aside); fix-two's stage is
    # refused, since its path no longer leads there
    assert (
        r.returncode == 6 and "the state folder was replaced during the run; nothing was written through it" in r.stderr
    ), r.stdout + r.stderr
    assert (tree / ".fixpack.swapped-away" / "state.json").exists()
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 6 and "the state folder is a symlink" in r.stderr, r.stdout + r.stderr
    assert list(out.iterdir()) == []
