"""fixpack.fastpath in process: the container-start check says "already applied" only when the
files, the state record and the fixes are exactly at the pinned end state; any doubt is None."""

from __future__ import annotations

import json

import pytest

from fixpack import fastpath
from fixpack.pack import Pack
from testing.builders import fixpack


@pytest.fixture()
def applied(pack):
    root, tree = pack
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stderr
    return root, tree


def check(root, tree, opt_ins=(), port=None):
    return fastpath.already_applied(str(root), "test", list(opt_ins), port, str(tree), None)


def test_the_applied_default_selection_is_recognised(applied):
    root, tree = applied
    sel = check(root, tree)
    assert sel is not None and sel["key"] == "-|" and [s["fix"] for s in sel["steps"]] == ["fix-one", "fix-two"]


def test_a_pristine_tree_is_not_applied(pack):
    root, tree = pack
    assert check(root, tree) is None


def test_another_selection_is_not_the_applied_one(applied):
    root, tree = applied
    assert check(root, tree, opt_ins=["fix-opt"]) is None


def test_one_changed_byte_in_a_target_means_not_applied(applied):
    root, tree = applied
    target = tree / "pkg_a" / "mod.py"
    target.write_bytes(target.read_bytes().replace(b"line_3 = 3", b"line_3 = 4"))
    assert check(root, tree) is None


def test_an_unfinished_run_means_not_applied(applied):
    root, tree = applied
    (tree / ".fixpack" / "journal.json").write_text("{}")
    assert check(root, tree) is None


def test_a_fix_changed_since_the_lock_means_not_applied(applied):
    root, tree = applied
    fix_yaml = root / "fixes" / "fix-two" / "fix.yaml"
    fix_yaml.write_text(fix_yaml.read_text() + "notes: edited\n")
    assert check(root, tree) is None


@pytest.mark.parametrize("garbage", [b"", b"{not json", b"[]", json.dumps({"key": "-|", "steps": "x"}).encode()])
def test_a_damaged_state_record_is_doubt_not_an_error(applied, garbage):
    root, tree = applied
    (tree / ".fixpack" / "state.json").write_bytes(garbage)
    assert check(root, tree) is None


def test_fix_hash_is_the_pack_s_content_hash_without_parsing_yaml(pack):
    root, _ = pack
    p = Pack(root)
    for fid in ("fix-one", "fix-two", "fix-opt"):
        fix = p.fix(fid)
        assert fastpath.fix_hash(str(fix.dir)) == fix.content_hash()
    two = root / "fixes" / "fix-two"
    (two / "patch.diff").write_text("")  # two change files: which one is the fix? doubt
    assert fastpath.fix_hash(str(two)) is None


def test_locate_under_a_root_and_through_the_import_system(tmp_path):
    assert fastpath.locate(["vllm", "vllm_gaudi"], str(tmp_path)) == {
        "vllm": str(tmp_path / "vllm"),
        "vllm_gaudi": str(tmp_path / "vllm_gaudi"),
    }
    found = fastpath.locate(["fixpack"], None)
    assert found is not None and found["fixpack"].endswith("fixpack")
    assert fastpath.locate(["no_such_package_here"], None) is None
