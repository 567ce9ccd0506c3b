"""Hostile and malformed input: every case is refused with its exit code and a message that
names the problem, and nothing in the tree (or outside it) changes. The cases live in
packtests/hostile_cases.py, shared with bench/reliability_report.py."""

from __future__ import annotations

import pytest

from packtests.builders import DIFF_OPT, fixpack, make_pack, new_tree, tree_digest, write_lock
from packtests.hostile_cases import CASES, run_case


def test_there_are_at_least_40_distinct_cases():
    assert len({c.id for c in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused(case, tmp_path):
    run_case(case, tmp_path)


def test_crlf_file_and_crlf_patch_apply_byte_exact(tmp_path):
    """CRLF is kept byte for byte: a CRLF target with a CRLF diff applies, reverts exactly."""
    root = make_pack(tmp_path / "pack")
    from packtests.builders import write_tree

    src = write_tree(root / "pristine")
    (src / "pkg_b" / "x.py").write_bytes(b"alpha\r\nbeta\r\ngamma\r\n")
    (root / "fixes" / "fix-opt" / "patch.diff").write_bytes(DIFF_OPT.replace("\n", "\r\n").replace("--- a/pkg_b/x.py\r\n", "--- a/pkg_b/x.py\n").replace("+++ b/pkg_b/x.py\r\n", "+++ b/pkg_b/x.py\n").replace("@@ -1,3 +1,3 @@\r\n", "@@ -1,3 +1,3 @@\n").encode())
    write_lock(root)
    tree = new_tree(root, tmp_path / "tree")
    before = tree_digest(tree)
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "fix-opt", pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tree / "pkg_b" / "x.py").read_bytes() == b"alpha\r\nBETA\r\ngamma\r\n"
    assert fixpack("revert", "--all", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    assert tree_digest(tree) == before


def test_a_hunk_whose_text_occurs_twice_changes_only_the_line_it_names(tmp_path):
    root = make_pack(tmp_path / "pack")
    from packtests.builders import write_tree

    src = write_tree(root / "pristine")
    (src / "pkg_b" / "x.py").write_text("alpha\nbeta\ngamma\nalpha\nbeta\ngamma\n")
    diff = "--- a/pkg_b/x.py\n+++ b/pkg_b/x.py\n@@ -4,3 +4,3 @@\n alpha\n-beta\n+BETA\n gamma\n"
    (root / "fixes" / "fix-opt" / "patch.diff").write_text(diff)
    write_lock(root)
    tree = new_tree(root, tmp_path / "tree")
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "fix-opt", pack=root)
    assert r.returncode == 0, r.stderr
    assert (tree / "pkg_b" / "x.py").read_text() == "alpha\nbeta\ngamma\nalpha\nBETA\ngamma\n"


def test_duplicate_keys_in_fix_yaml_are_refused(tmp_path):
    root = make_pack(tmp_path / "pack")
    p = root / "fixes" / "fix-one" / "fix.yaml"
    p.write_text(p.read_text() + "summary: a second summary\n")
    before = p.read_bytes()
    r = fixpack("validate", pack=root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{p}: invalid YAML: duplicate key 'summary' at line" in r.stdout + r.stderr
    assert p.read_bytes() == before


def test_duplicate_keys_in_a_nested_mapping_and_a_profile_are_refused(tmp_path):
    root = make_pack(tmp_path / "pack")
    prof = next((root / "profiles").glob("*.yaml"))
    text = prof.read_text()
    prof.write_text(text.replace("base:\n", "base:\n  pytorch: '2.11'\n  pytorch: '2.12'\n", 1) if "base:\n" in text else text + "name: again\n")
    r = fixpack("validate", pack=root)
    assert r.returncode == 2 and "duplicate key" in r.stdout + r.stderr and str(prof) in r.stdout + r.stderr
