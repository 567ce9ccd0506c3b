"""fixpack.apply.fastpath in process: the container-start check says "already applied" only when the
files, the state record and the fixes are exactly at the pinned end state; any doubt is None."""

from __future__ import annotations

import json

import pytest

from fixpack.apply import fastpath, locations, targets
from fixpack.pack.pack import Pack
from packtests.builders import fixpack


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
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm_gaudi").mkdir()
    assert locations.locate(["vllm", "vllm_gaudi", "absent"], str(tmp_path)) == {
        "vllm": str(tmp_path / "vllm"),
        "vllm_gaudi": str(tmp_path / "vllm_gaudi"),
    }
    found = locations.locate(["fixpack"], None)
    assert found["fixpack"].endswith("fixpack")
    assert locations.locate(["no_such_package_here", "no.such"], None) == {}
    assert targets.locate(["vllm", "absent"], tmp_path) == {"vllm": tmp_path / "vllm"}


def test_a_package_missing_under_the_root_is_doubt(applied):
    root, tree = applied
    assert check(root, tree) is not None
    (tree / "pkg_b").rename(tree / "moved")  # a package the lock names, no file fixed in it
    assert check(root, tree) is None


def _relayout(root, release_dir: bool):
    """What the fix-centric layout did to a pack: fix.yaml rewritten (releases: and its prose),
    a change file moved into the release's folder, the change itself byte for byte the same."""
    d = root / "fixes" / "fix-one"
    text = (
        (d / "fix.yaml")
        .read_text()
        .replace("why: a synthetic defect", "why: the same synthetic defect, described again")
    )
    if release_dir:
        (d / "test").mkdir()
        (d / "patch.diff").rename(d / "test" / "patch.diff")
        text = text.replace(
            '"releases": {"test": {"status": "applies"}}',
            '"releases": {"test": {"status": "refreshed", "why": "moved"}}',
        )
        text = text.replace(
            'releases: {"test": {"status": "applies"}}', 'releases: {"test": {"status": "refreshed", "why": "moved"}}'
        )
    (d / "fix.yaml").write_text(text)


@pytest.mark.parametrize("release_dir", [False, True], ids=["fix.yaml-rewritten", "change-moved-to-release-folder"])
def test_an_image_applied_with_the_old_layout_is_still_recognised_after_the_relock(applied, release_dir):
    """An image whose state record names a fix's hash from before the layout change: the lock,
    re-made with the same pins, keeps that hash as `earlier`, so the container-start check, the
    full engine's apply and `fixpack verify` all see the image as applied, and nothing is rewritten."""
    from packtests.builders import write_lock

    root, tree = applied
    state_before = (tree / ".fixpack" / "state.json").read_bytes()
    old_hash = json.loads((root / "profiles" / "test.lock.json").read_text())["fixes"]["fix-one"]["hash"]
    _relayout(root, release_dir)
    assert check(root, tree) is None  # the lock is not re-made yet: the pack and the lock disagree
    write_lock(root)
    lock = json.loads((root / "profiles" / "test.lock.json").read_text())
    assert lock["fixes"]["fix-one"]["earlier"] == [old_hash] and lock["fixes"]["fix-one"]["hash"] != old_hash
    sel = check(root, tree)
    assert sel is not None and [s["fix"] for s in sel["steps"]] == ["fix-one", "fix-two"]
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0 and "already applied" in r.stdout, r.stdout + r.stderr
    assert (tree / ".fixpack" / "state.json").read_bytes() == state_before
    v = fixpack("verify", "--profile", "test", "--root", str(tree), pack=root)
    assert v.returncode == 0 and "no drift" in v.stdout, v.stdout + v.stderr


def test_without_the_earlier_hash_the_old_image_is_re_applied_to_the_same_pins(applied):
    """A lock made from scratch (no previous lock to carry from) does not know the old hash: the
    image is not taken as applied, and `fixpack apply` re-applies it to exactly the same bytes."""
    from packtests.builders import write_lock

    root, tree = applied
    files = {p: p.read_bytes() for p in (tree / "pkg_a").rglob("*.py")}
    _relayout(root, False)
    (root / "profiles" / "test.lock.json").unlink()
    write_lock(root)
    assert check(root, tree) is None
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fix-one" in r.stdout
    assert {p: p.read_bytes() for p in files} == files
    assert check(root, tree) is not None
