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
