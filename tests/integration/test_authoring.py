"""`fixpack edit` / `fixpack commit`: write a fix by editing a tree, as pnpm patch and
patch-package let users write theirs (fixpack/proofs/authoring.py)."""

from __future__ import annotations

import json
from pathlib import Path

from packtests import builders as B
from packtests import reliability_lib as L


def _edit(root: Path, *args: str):
    r = B.fixpack("edit", *args, "--profile", "test", "--pristine", str(root / "pristine"), pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    return Path(r.stdout.splitlines()[0])


def _apply_fresh(root: Path, work: Path, *opt: str) -> Path:
    tree = B.new_tree(root, work)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), *opt, pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    return tree


def test_a_new_fix_is_written_from_an_edited_tree_and_locked(tmp_path):
    root, _ = L.copy_pack("basic", tmp_path)
    tree = _edit(root, "fix-new")
    # the tree is at the state a new fix meets: the profile's default fixes applied
    fixed = _apply_fresh(root, tmp_path / "ref")
    assert (tree / "pkg_a" / "mod.py").read_bytes() == (fixed / "pkg_a" / "mod.py").read_bytes()
    x = tree / "pkg_a" / "mod.py"  # after fix-one, in every selection (fix-opt changes pkg_b)
    x.write_text(x.read_text().replace("\n", "\n# fixed by fix-new\n", 1))
    edited = x.read_bytes()
    r = B.fixpack("commit", "fix-new", pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    d = root / "fixes" / "fix-new"
    assert sorted(p.name for p in d.iterdir()) == ["fix.yaml", "patch.diff", "test_fix_new.py"]
    assert "--- a/pkg_a/mod.py\n+++ b/pkg_a/mod.py\n" in (d / "patch.diff").read_text()
    assert "{package: pkg_a, path: mod.py}" in (d / "fix.yaml").read_text()
    assert "pytest.fail(" in (d / "test_fix_new.py").read_text()  # a stub that fails until written
    assert (root / "profiles" / "test.yaml").read_text().rstrip().endswith("- id: fix-new")
    assert not (root / ".fixpack-work" / "edit" / "fix-new").exists()
    v = B.fixpack("validate", pack=root)
    assert v.returncode == 0, v.stdout + v.stderr
    lock = json.loads((root / "profiles" / "test.lock.json").read_text())
    assert "fix-new" in lock["fixes"]
    assert (_apply_fresh(root, tmp_path / "after") / "pkg_a" / "mod.py").read_bytes() == edited


def test_editing_an_existing_diff_fix_starts_from_its_result_and_rewrites_its_diff(tmp_path):
    root, _ = L.copy_pack("basic", tmp_path)
    before = _apply_fresh(root, tmp_path / "before")
    tree = _edit(root, "fix-one")
    mod = tree / "pkg_a" / "mod.py"
    assert mod.read_bytes() == (before / "pkg_a" / "mod.py").read_bytes()  # fix-one applied
    mod.write_text(mod.read_text() + "EXTRA = 1\n")
    edited = mod.read_bytes()
    r = B.fixpack("commit", "fix-one", pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "+EXTRA = 1\n" in (root / "fixes" / "fix-one" / "patch.diff").read_text()
    assert (_apply_fresh(root, tmp_path / "after") / "pkg_a" / "mod.py").read_bytes() == edited


def test_a_codemod_is_checked_against_the_edited_tree(tmp_path):
    root, _ = L.copy_pack("basic", tmp_path)
    lock_before = (root / "profiles" / "test.lock.json").read_bytes()
    _edit(root, "fix-two")
    r = B.fixpack("commit", "fix-two", "--keep", pack=root)  # untouched: the codemod's own result
    assert r.returncode == 0 and "codemod.py gives exactly the edited files (pkg_a/sub/other.py)" in r.stdout, r.stdout + r.stderr
    other = root / ".fixpack-work" / "edit" / "fix-two" / "tree" / "pkg_a" / "sub" / "other.py"
    other.write_text(other.read_text() + "MORE = 2\n")
    r = B.fixpack("commit", "fix-two", pack=root)
    assert r.returncode == 9, r.stdout + r.stderr
    assert "does not give the edited tree" in r.stderr and "-MORE = 2" in r.stderr
    assert (root / "profiles" / "test.lock.json").read_bytes() == lock_before  # nothing re-locked


def test_added_files_and_an_unchanged_tree_are_refused_with_nothing_written(tmp_path):
    root, _ = L.copy_pack("basic", tmp_path)
    tree = _edit(root, "fix-new")
    r = B.fixpack("commit", "fix-new", pack=root)
    assert r.returncode == 2 and "nothing was changed under" in r.stderr
    (tree / "pkg_a" / "new.py").write_text("x = 1\n")
    r = B.fixpack("commit", "fix-new", pack=root)
    assert r.returncode == 2 and "added pkg_a/new.py" in r.stderr and "nothing was written" in r.stderr
    assert not (root / "fixes" / "fix-new").exists()
    r = B.fixpack("edit", "fix-new", "--profile", "test", "--pristine", str(root / "pristine"), pack=root)
    assert r.returncode == 2 and "an edit in progress" in r.stderr


def test_a_port_patch_needs_its_port_named(tmp_path):
    root, _ = L.copy_pack("basic", tmp_path)
    r = B.fixpack("edit", "no/such", "--profile", "test", pack=root)
    assert r.returncode == 2 and "fix id" in r.stderr


def test_a_fix_that_cannot_be_locked_says_it_was_written_and_keeps_the_workspace(tmp_path):
    root, _ = L.copy_pack("basic", tmp_path)
    tree = _edit(root, "fix-new")
    x = tree / "pkg_b" / "x.py"  # the opt-in fix-opt changes the same line in its selections
    x.write_text(x.read_text().replace("beta", "gamma"))
    r = B.fixpack("commit", "fix-new", pack=root)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "fix-new was written to the pack, but `fixpack lock --profile test` fails" in r.stderr
    assert (root / ".fixpack-work" / "edit" / "fix-new" / "tree").is_dir()


def test_an_edit_that_changes_nothing_in_a_diff_fix_leaves_its_file_and_hash_alone(tmp_path):
    root, _ = L.copy_pack("basic", tmp_path)
    diff = (root / "fixes" / "fix-one" / "patch.diff").read_bytes()
    _edit(root, "fix-one")
    r = B.fixpack("commit", "fix-one", pack=root)
    assert r.returncode == 0 and "patch.diff already gives the edited files: left as it is" in r.stdout, r.stdout + r.stderr
    assert (root / "fixes" / "fix-one" / "patch.diff").read_bytes() == diff


def test_a_new_entry_keeps_the_list_form_and_comments_or_is_refused_before_anything_is_written(tmp_path):
    from fixpack.errors import ConfigError
    from fixpack.proofs.authoring import _with_entry

    f = tmp_path / "port.yaml"
    f.write_text("name: p\n# the patches\npatches: []  # none yet\n")
    assert _with_entry(f, "patches", "new-one") == "name: p\n# the patches\npatches:\n  - new-one\n"
    f.write_text("fixes:\n  - id: a   # first\n  - id: b\n    opt_in: true\n")
    assert _with_entry(f, "fixes", "c").endswith("    opt_in: true\n  - id: c\n")
    f.write_text("patches:\n  - a   # first\n  - b\n# what follows\nplugin: {package: x}\n")
    assert _with_entry(f, "patches", "c") == "patches:\n  - a   # first\n  - b\n  - c\n# what follows\nplugin: {package: x}\n"
    f.write_text("name: x\npatches: {a: 1}\n")
    try:
        _with_entry(f, "patches", "c")
        raise AssertionError("a list that is not a block list was edited")
    except ConfigError as exc:
        assert "by hand" in str(exc) and "nothing was written" in str(exc)
