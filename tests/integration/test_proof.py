"""The proof rules of `fixpack check` (fixpack/proofs/proof.py) on synthetic fixes, in milliseconds
of tree: what counts as red, what as a guard, which part of a change is needed.

Each case is a real pytest run through the plugin's report, on a tiny tree, so the rules are
shown to fail as well as to pass."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest

from packtests.builders import write_fix, write_tree

TESTS = textwrap.dedent(
    '''
    import pytest


    @pytest.fixture()
    def broken():
        raise RuntimeError("fixture cannot set up")


    def test_assertion(tree):
        import pkg_a.mod as m
        assert m.line_12 == 13, "line_12 is still 12"


    def test_undeclared_exception(tree):
        import pkg_a.mod as m
        {}[m.line_12]


    @pytest.mark.red_raises("KeyError")
    def test_declared_exception(tree):
        import pkg_a.mod as m
        {}[m.line_12]


    @pytest.mark.red_raises("KeyError")
    def test_declared_but_other_exception(tree):
        raise ValueError("not the declared one")


    def test_fixture_error(tree, broken):
        assert False


    def test_passes(tree):
        assert True


    def test_guard(tree):
        assert True


    @pytest.mark.parametrize("x", [1, 2])
    def test_close(tree, x):
        import torch.testing  # an assertion helper: still the test's own assertion
        torch.testing.assert_close(torch_tensor(x), torch_tensor(3))


    def torch_tensor(v):
        import torch
        return torch.tensor(float(v))
    '''
)


@pytest.fixture()
def fix(tmp_path, monkeypatch):
    from fixpack.pack.pack import load_fix

    monkeypatch.setenv("FIXPACK_TEST_SERVER", "0")  # a few tiny runs: no preloading server
    d = write_fix(tmp_path / "pack", "fix-x", "diff", ["pkg_a/mod.py"], "--- a/pkg_a/mod.py\n+++ b/pkg_a/mod.py\n@@ -12 +12 @@\n-line_12 = 12\n+line_12 = 13\n",
                  regression_guards=["test_guard"])
    (d / "test_it.py").write_text(TESTS)
    tree = write_tree(tmp_path / "tree")
    return load_fix(d), tree


@pytest.mark.parametrize("server", ["0", "1"], ids=["fresh-interpreter", "test-server"])
def test_each_kind_of_failure_is_told_apart(fix, monkeypatch, server):
    from fixpack.proofs import proof

    monkeypatch.setenv("FIXPACK_TEST_SERVER", server)
    f, tree = fix
    try:
        run = proof.run_tests(f, tree, 300)
    finally:
        proof.close_servers()
    verdict = {rec["name"]: proof.red_of(rec) for rec in run.tests.values()}
    assert verdict["test_assertion"] == (True, "line_12 is still 12")
    ok, cause = verdict["test_undeclared_exception"]
    assert not ok and "raised KeyError at test_it.py" in cause and 'red_raises(KeyError)' in cause
    assert verdict["test_declared_exception"] == (True, "KeyError: 12")
    ok, cause = verdict["test_declared_but_other_exception"]
    assert not ok and "not the declared KeyError" in cause
    ok, cause = verdict["test_fixture_error"]
    assert not ok and cause.startswith("error in setup") and "fixture cannot set up" in cause
    assert verdict["test_passes"] == (False, "passes before the fix")
    assert verdict["test_close[1]"][0] and "not close" in verdict["test_close[1]"][1]


def test_a_collection_error_is_never_red(fix):
    from fixpack.proofs import proof

    f, tree = fix
    (f.dir / "test_it.py").write_text("import no_such_module_anywhere\n\ndef test_x(tree):\n    assert False\n")
    run = proof.run_tests(f, tree, 300)
    assert not run.tests and "no_such_module_anywhere" in run.collect_errors[0]["cause"]
    rg = proof.red_green(f, run, run)
    assert rg["red_green"] == 0 and any("collection error" in p for p in rg["problems"])


def test_guards_must_be_declared_and_pass_both_sides(fix):
    from fixpack.proofs import proof

    f, tree = fix
    before = proof.run_tests(f, tree, 300)
    rows = {r["test"]: r for r in proof.red_green(f, before, before)["tests"]}
    assert rows["test_guard"]["role"] == "guard" and rows["test_guard"]["ok"]
    assert rows["test_passes"]["role"] == "red-green" and not rows["test_passes"]["ok"]
    # the same "after" run as "before": nothing red-then-green passes after
    assert not rows["test_assertion"]["ok"]
    f.meta["regression_guards"] = ["test_guard", "test_no_such"]
    problems = proof.red_green(f, before, before)["problems"]
    assert any("regression_guards names 'test_no_such'" in p for p in problems)


def test_a_guard_that_fails_before_is_refused():
    from fixpack.proofs import proof

    fix = SimpleNamespace(meta={"regression_guards": ["test_g"]}, dir=None)
    failed = {"name": "test_g", "declared": [], "phases": {"setup": {"outcome": "passed"}, "call": {"outcome": "failed", "exc_type": "AssertionError", "exc_mro": ["AssertionError"], "raised_in_test": True, "cause": "boom"}}}
    passed = {"name": "test_g", "declared": [], "phases": {"setup": {"outcome": "passed"}, "call": {"outcome": "passed"}}}
    rg = proof.red_green(fix, proof.TestRun(1, 0, {"t.py::test_g": failed}), proof.TestRun(0, 0, {"t.py::test_g": passed}))
    assert rg["guards"] == 0 and "declared a regression guard but fails before the fix" in rg["problems"][0]


def test_parts_of_a_diff_and_of_an_edit_are_left_out_one_at_a_time(tmp_path):
    from fixpack.pack.pack import load_fix
    from fixpack.proofs import proof

    tree = write_tree(tmp_path / "tree")
    diff = (
        "--- a/pkg_a/mod.py\n+++ b/pkg_a/mod.py\n"
        "@@ -2,3 +2,3 @@\n line_2 = 2\n-line_3 = 3\n+line_3 = 33\n line_4 = 4\n"
        "@@ -20,3 +20,3 @@\n line_20 = 20\n-line_21 = 21\n+line_21 = 21  # a comment only\n line_22 = 22\n"
    )
    d = write_fix(tmp_path / "pack", "two-hunks", "diff", ["pkg_a/mod.py"], diff)
    f = load_fix(d)
    full, parts = proof.apply_change(f, tree)
    assert [p.label for p in parts] == ["pkg_a/mod.py @@ -2,3 +2,3 @@", "pkg_a/mod.py @@ -20,3 +20,3 @@"]
    no_first, _ = proof.apply_change(f, tree, drop=0)
    assert b"line_3 = 3\n" in no_first["pkg_a/mod.py"] and b"# a comment only" in no_first["pkg_a/mod.py"]
    no_second, _ = proof.apply_change(f, tree, drop=1)
    assert proof.same_code(no_second["pkg_a/mod.py"], full["pkg_a/mod.py"])  # comment-only part
    assert not proof.same_code(no_first["pkg_a/mod.py"], full["pkg_a/mod.py"])
    assert (tree / "pkg_a" / "mod.py").read_bytes().count(b"line_3 = 3\n") == 1  # the tree is left as it was

    edits = textwrap.dedent(
        """
        - {target: pkg_a/sub/other.py, in: Batch.rows, replace: "# keyed by persistent index", with: "# keyed by row"}
        - {target: pkg_a/sub/other.py, in: Batch.rows, replace: "return [self.table[i] for i in ids]", with: "return [self.table[r] for r in ids]"}
        - {target: pkg_a/sub/other.py, in: helper, replace: "return x + 1", with: "return x + 2"}
        """
    )
    d = write_fix(tmp_path / "pack", "three-edits", "edit", ["pkg_a/sub/other.py"], edits)
    f = load_fix(d)
    full, parts = proof.apply_change(f, tree)
    assert len(parts) == 3 and all(p.label.split(":")[0] in ("Batch.rows", "helper") for p in parts)
    outs = [proof.apply_change(f, tree, drop=i)[0]["pkg_a/sub/other.py"] for i in range(3)]
    assert all(o != full["pkg_a/sub/other.py"] for o in outs)
    same = [proof.same_code(o, full["pkg_a/sub/other.py"]) for o in outs]
    assert same.count(True) == 1  # the comment edit
    from fixpack.kinds.edit import load

    assert sorted(e.new for e in load(d)) == ["# keyed by row", "return [self.table[r] for r in ids]", "return x + 2"]


def test_requires_closure_names_a_missing_fix():
    from pathlib import Path

    from fixpack.errors import ConfigError
    from fixpack.proofs import proof

    a = SimpleNamespace(id="a", requires=[], dir=Path("fixes/a"))
    b = SimpleNamespace(id="b", requires=["a"], dir=Path("fixes/b"))
    c = SimpleNamespace(id="c", requires=["b"], dir=Path("fixes/c"))
    assert proof.requires_closure(c, {"a": a, "b": b, "c": c}) == {"a", "b"}
    with pytest.raises(ConfigError, match="requires 'a', which is not in this selection"):
        proof.requires_closure(b, {"b": b})
