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
