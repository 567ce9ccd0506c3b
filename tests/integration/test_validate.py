"""Schema validation: every malformed fix, profile or reference is named with its file and key."""

from __future__ import annotations

from packtests.builders import fixpack, make_pack, write_fix


def test_a_valid_pack_validates(tmp_path):
    root = make_pack(tmp_path / "pack")
    r = fixpack("validate", pack=root)
    assert r.returncode == 0, r.stdout
    assert "3 fix folders" in r.stdout and "0 error(s)" in r.stdout


def edit_yaml(root, fid, old, new):
    p = root / "fixes" / fid / "fix.yaml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))
    return p


def expect_error(root, *needles):
    r = fixpack("validate", pack=root)
    assert r.returncode == 2, r.stdout
    for n in needles:
        assert n in r.stdout, (n, r.stdout)


def test_unknown_key_is_named_with_its_file(tmp_path):
    root = make_pack(tmp_path / "pack")
    p = edit_yaml(root, "fix-one", "kind: diff", "kind: diff\nseverity: high")
    expect_error(root, str(p), "unknown key 'severity'")


def test_wrong_type_is_named(tmp_path):
    root = make_pack(tmp_path / "pack")
    edit_yaml(root, "fix-one", "tests: [test_it.py]", "tests: test_it.py")
    expect_error(root, "key 'tests' must be list")


def test_id_that_is_not_a_slug_or_not_the_folder(tmp_path):
    root = make_pack(tmp_path / "pack")
    edit_yaml(root, "fix-one", "id: fix-one", "id: Fix One")
    expect_error(root, "'Fix One' is not a valid id")
    edit_yaml(root, "fix-one", "id: Fix One", "id: fix-uno")
    expect_error(root, "key 'id' is 'fix-uno' but the folder is 'fix-one'")


def test_missing_change_and_test_files(tmp_path):
    root = make_pack(tmp_path / "pack")
    (root / "fixes" / "fix-one" / "patch.diff").unlink()
    (root / "fixes" / "fix-two" / "test_it.py").unlink()
    expect_error(root, "patch.diff does not exist", "tests[0] names test_it.py, which does not exist")


def test_diff_changing_an_undeclared_file(tmp_path):
    root = make_pack(tmp_path / "pack")
    edit_yaml(root, "fix-opt", "path: x.py", "path: y.py")
    expect_error(root, "changes ['pkg_b/x.py'] but fix.yaml declares ['pkg_b/y.py']")


def test_not_cpu_demonstrable_needs_a_device_gate(tmp_path):
    root = make_pack(tmp_path / "pack")
    write_fix(root, "fix-dev", "diff", ["pkg_b/x.py"], (root / "fixes" / "fix-opt" / "patch.diff").read_text(), cpu_demonstrable=False)
    expect_error(root, "cpu_demonstrable is false, so key 'device_gate'")


def test_profile_naming_a_missing_fix_or_a_fix_twice(tmp_path):
    root = make_pack(tmp_path / "pack", fixes=[{"id": "fix-one"}, {"id": "fix-ghost"}])
    expect_error(root, "fix 'fix-ghost' has no folder")
    root2 = make_pack(tmp_path / "pack2", fixes=[{"id": "fix-one"}, {"id": "fix-one"}])
    expect_error(root2, "'fix-one' is listed twice")


def test_requirement_that_comes_later_in_pack_order(tmp_path):
    root = make_pack(tmp_path / "pack")
    edit_yaml(root, "fix-one", "tests: [test_it.py]", "tests: [test_it.py]\nrequires: [fix-two]")
    expect_error(root, "'fix-two' comes after fix-one")


def test_yaml_python_tags_are_refused_not_executed(tmp_path):
    root = make_pack(tmp_path / "pack")
    marker = tmp_path / "pwned"
    edit_yaml(root, "fix-one", "summary: synthetic fix fix-one", f"summary: !!python/object/apply:os.system ['touch {marker}']")
    expect_error(root, "invalid YAML")
    assert not marker.exists()


def test_pins_defect_tests_entries_are_checked(tmp_path):
    root = make_pack(tmp_path / "pack")
    good = (
        "kind: diff\npins_defect_tests:\n  - suite: vllm-gaudi tests/unit_tests\n"
        "    test: tests/unit_tests/test_x.py::test_y\n    why: it asserts the stale value\n"
    )
    p = edit_yaml(root, "fix-one", "kind: diff", good)
    assert fixpack("validate", pack=root).returncode == 0
    p.write_text(p.read_text().replace("    why: it asserts the stale value\n", ""))
    expect_error(root, "pins_defect_tests[0]: missing key 'why'")
    p.write_text(p.read_text().replace("test: tests/unit_tests/test_x.py::test_y\n", "test: test_y\n    why: w\n"))
    expect_error(root, "pins_defect_tests[0].test must be FILE.py::NAME")
