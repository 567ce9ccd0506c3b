"""The codemod kind: anchored on named definitions, exact, idempotent, layout-preserving."""

from __future__ import annotations

import pytest

from fixpack.codemod import Rewrite, RewriteError, apply_rewrites, replace_once

SRC = '''class A:
    x = 1

    def f(self):
        return 1

    def g(self):
        return 2


def g():
    return 2
'''


def rewrite(node_names, old, new, target="pkg/t.py"):
    class R(Rewrite):
        nodes = node_names

        def rewrite(self, qualname, node):
            return replace_once(node, old, new)

    R.target = target
    return R


def test_rewrites_only_the_named_method_and_keeps_blank_lines():
    out = apply_rewrites([rewrite(["A.g"], "return 2", "return 3")], "pkg/t.py", SRC).text
    assert out == SRC.replace("    def g(self):\n        return 2", "    def g(self):\n        return 3")


def test_is_a_fixed_point_of_itself():
    r = [rewrite(["A.g"], "return 2", "return 2  # fixed")]
    once = apply_rewrites(r, "pkg/t.py", SRC).text
    assert apply_rewrites(r, "pkg/t.py", once).text == once


def test_missing_definition_is_an_error():
    with pytest.raises(RewriteError, match="A.h in pkg/t.py: expected exactly one definition, found 0"):
        apply_rewrites([rewrite(["A.h"], "x", "y")], "pkg/t.py", SRC)


def test_text_found_twice_is_an_error():
    src = SRC.replace("return 2\n\n\ndef", "return 2 + 2\n\n\ndef")
    with pytest.raises(RewriteError, match="exactly once, found it 2 times"):
        apply_rewrites([rewrite(["A.g"], "return 2", "return 9")], "pkg/t.py", src.replace("        return 2", "        return 2; return 2"))


def test_other_targets_are_left_alone():
    result = apply_rewrites([rewrite(["A.g"], "return 2", "return 3", target="pkg/other.py")], "pkg/t.py", SRC)
    assert result.text == SRC and result.rewritten == []


TRICKY = '''import functools


@functools.lru_cache
def top(x):
    return x  # top


class Outer:
    """Doc."""

    class Inner:
        @staticmethod
        @functools.wraps(top)
        def deep(y):
            text = """
col zero line inside a string
"""
            return y

    async def co(self):
        return 1
    # a trailing comment at method depth

if True:
\tdef guarded():
\t\treturn 0
'''


@pytest.mark.parametrize(
    "node, old, new",
    [
        ("top", "return x  # top", "return x + 1  # top"),
        ("Outer.Inner.deep", "return y", "return y * 2"),
        ("Outer.co", "return 1", "return 2"),
        ("guarded", "return 0", "return 1"),
        ("Outer.Inner", "class Inner:", "class Inner:  # renamed nothing"),
    ],
)
def test_parsing_only_the_definition_gives_the_same_bytes_as_a_whole_module_parse(node, old, new):
    from fixpack.codemod import apply_rewrites_whole_module

    r = [rewrite([node], old, new)]
    fast = apply_rewrites(r, "pkg/t.py", TRICKY).text
    assert fast == apply_rewrites_whole_module(r, "pkg/t.py", TRICKY).text
    assert fast != TRICKY and new in fast
    assert "col zero line inside a string\n" in fast  # string content never re-indented


# ---- the text form used by pinned runs (the pin is checked by the worker; see apply_rewrites)


@pytest.fixture
def no_libcst(monkeypatch):
    """Importing libcst fails: whatever passes took the text form."""
    import sys

    for name in [m for m in sys.modules if m == "libcst" or m.startswith("libcst.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "libcst", None)


@pytest.mark.parametrize(
    "node, old, new",
    [
        ("top", "return x  # top", "return x + 1  # top"),
        ("Outer.Inner.deep", "return y", "return y * 2"),
        ("Outer.Inner.deep", "text = \"\"\"\ncol zero", "text = \"\"\"\ncol ZERO"),
        ("Outer.Inner", "return y", "return y  # in a nested class"),
    ],
)
def test_text_form_gives_the_bytes_of_the_libcst_tree_without_importing_it(node, old, new, no_libcst, monkeypatch):
    r = [rewrite([node], old, new)]
    as_text = apply_rewrites(r, "pkg/t.py", TRICKY, as_text=True).text
    monkeypatch.undo()
    assert as_text == apply_rewrites(r, "pkg/t.py", TRICKY).text
    assert as_text != TRICKY


@pytest.mark.parametrize(
    "node, old, new",
    [
        # libcst drops a comment that ends the new text of a definition; the text form keeps it
        ("Outer.co", "return 1", "return 2\n\n# between"),
        # a tab-indented block: libcst re-indents the body with the module's default indent
        ("guarded", "return 0", "return 1"),
    ],
)
def test_where_the_forms_differ_the_pin_decides(node, old, new, tmp_path):
    """The worker tries the text form only when the output is pinned, and runs libcst when
    the text form misses the pin: a pinned run always ends on the pinned bytes."""
    from fixpack import worker
    from fixpack.hashing import sha256_bytes

    r = [rewrite([node], old, new)]
    tree = apply_rewrites(r, "pkg/t.py", TRICKY).text
    text = apply_rewrites(r, "pkg/t.py", TRICKY, as_text=True).text
    assert text != tree
    fix = tmp_path / "fix"
    fix.mkdir()
    (fix / "codemod.py").write_text(
        "from fixpack.codemod import Rewrite, replace_once\n\n\n"
        f"class R(Rewrite):\n    target = 'pkg/t.py'\n    nodes = [{node!r}]\n\n"
        f"    def rewrite(self, qualname, node):\n        return replace_once(node, {old!r}, {new!r})\n"
    )
    (tmp_path / "t.py").write_text(TRICKY)
    for pinned in (tree, text, None):
        stage = tmp_path / "stage"
        stage.mkdir(exist_ok=True)
        job = {"fix_dir": str(fix), "kind": "codemod", "stage_dir": str(stage), "targets": [{"rel": "pkg/t.py", "src": str(tmp_path / "t.py"), "out": str(stage / "0.out")}]}
        if pinned is not None:
            job["expect"] = {"pkg/t.py": sha256_bytes(pinned.encode())}
        worker.run(job)
        assert (stage / "0.out").read_text() == (pinned if pinned is not None else tree)


def test_a_rewrite_that_needs_the_tree_gets_it_in_a_pinned_run():
    import libcst as cst

    class Rename(Rewrite):
        target = "pkg/t.py"
        nodes = ["A.g"]

        def rewrite(self, qualname, node):
            return node.with_changes(name=cst.Name("h"))  # not a text edit: needs the tree

    text = apply_rewrites([Rename], "pkg/t.py", SRC, as_text=True).text
    assert text == SRC.replace("def g(self)", "def h(self)")


def test_a_text_form_that_cannot_match_falls_back_to_the_tree():
    # A blank line indented between the method's two levels renders differently at column 0
    # in the two forms; the edit that spans it only matches libcst's, which then decides.
    src = SRC.replace("    def g(self):\n        return 2", "    def g(self):\n        a = 1\n      \n        return 2")
    r = [rewrite(["A.g"], "a = 1\n      \n    return 2", "a = 1\n      \n    return 3")]
    tree = apply_rewrites(r, "pkg/t.py", src).text
    assert "return 3" in tree
    assert apply_rewrites(r, "pkg/t.py", src, as_text=True).text == tree


def test_anchors_from_the_lock_locate_definitions_and_a_wrong_one_is_refused():
    r = [rewrite(["A.g"], "return 2", "return 3")]
    first = apply_rewrites(r, "pkg/t.py", SRC)
    assert first.anchors == {"A.g": [7, 8]}
    assert apply_rewrites(r, "pkg/t.py", SRC, anchors=first.anchors).text == first.text
    with pytest.raises(RewriteError, match=r"the lock's anchor \(lines 4-5\) is not that definition"):
        apply_rewrites(r, "pkg/t.py", SRC, anchors={"A.g": [4, 5]})


def test_rewrites_of_disjoint_definitions_share_one_parse_and_overlapping_ones_run_in_turn():
    one = rewrite(["A.f"], "return 1", "return 10")
    two = rewrite(["A.g", "g"], "return 2", "return 20")
    both = apply_rewrites([one, two], "pkg/t.py", SRC)
    assert both.text == SRC.replace("return 1", "return 10").replace("return 2", "return 20")
    assert set(both.anchors) == {"A.f", "A.g", "g"}
    # a second class rewriting the same method sees the first one's output
    again = rewrite(["A.f"], "return 10", "return 100")
    chained = apply_rewrites([one, again], "pkg/t.py", SRC)
    assert "return 100" in chained.text and chained.anchors == {}
