"""The codemod kind: LibCST matchers, each declared place found exactly once, idempotent."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixpack.kinds import codemod
from fixpack.kinds.base import ChangeError

SRC = """class A:
    def f(self):
        return g(1, 2)

    def h(self):
        return g(1, 2)
"""

CODEMOD = """
import libcst as cst
import libcst.matchers as m
from fixpack.kinds.codemod import Codemod


class SecondArgumentInF(Codemod):
    DESCRIPTION = "g's second argument in A.f is 3."
    TARGET = "pkg/t.py"
    PLACES = ("g's second argument",)

    @m.call_if_inside(m.FunctionDef(name=m.Name({fn!r})))
    @m.leave(m.Call(func=m.Name("g")))
    def second(self, original, updated):
        args = list(updated.args)
        new = updated.with_changes(args=[args[0], args[1].with_changes(value=cst.Integer("3"))])
        return self.at("g's second argument", updated, {result})
"""


def fix(tmp_path: Path, fn: str = "f", result: str = "new") -> Path:
    d = tmp_path / "fix"
    d.mkdir(exist_ok=True)
    (d / "codemod.py").write_text(CODEMOD.format(fn=fn, result=result))
    return d


def run(d: Path, src: str = SRC, drop: int | None = None) -> str:
    return codemod.apply(d, {"pkg/t.py": src.encode()}, drop).outputs["pkg/t.py"].decode()


def test_changes_the_place_inside_the_named_function_only(tmp_path):
    assert run(fix(tmp_path)) == SRC.replace("return g(1, 2)", "return g(1, 3)", 1)


def test_runs_on_its_own_output_unchanged(tmp_path):
    once = run(fix(tmp_path))
    assert run(fix(tmp_path), once) == once


@pytest.mark.parametrize("fn, count", [("nope", 0), ("f|h", 2)])
def test_a_place_found_other_than_once_is_an_error_with_the_count(tmp_path, fn, count):
    d = tmp_path / "fix"
    d.mkdir()
    text = CODEMOD.format(fn="f", result="new")
    if fn == "nope":
        text = text.replace("m.Name('f')", "m.Name('nope')")
    else:
        text = text.replace("m.Name('f')", "m.Name('f') | m.Name('h')")
    (d / "codemod.py").write_text(text)
    with pytest.raises(
        ChangeError, match=f"g's second argument in pkg/t.py: expected exactly one place, found {count}"
    ):
        run(d)


def test_a_handler_returning_no_node_is_refused(tmp_path):
    with pytest.raises(ChangeError, match="returned str, not a libcst node"):
        run(fix(tmp_path, result="'g(1, 3)'"))


def test_a_skipped_place_is_found_but_left_as_it_is(tmp_path):
    d = fix(tmp_path)
    assert run(d, drop=0) == SRC
    assert codemod.apply(d, {"pkg/t.py": SRC.encode()}).parts == ["SecondArgumentInF: g's second argument"]


def test_a_module_without_a_codemod_or_its_declarations_is_refused(tmp_path):
    d = tmp_path / "fix"
    d.mkdir()
    (d / "codemod.py").write_text("X = 1\n")
    with pytest.raises(ChangeError, match="defines no Codemod subclass"):
        codemod.load(d)
    (d / "codemod.py").write_text(
        CODEMOD.format(fn="f", result="new").replace('    DESCRIPTION = "g\'s second argument in A.f is 3."\n', "")
    )
    with pytest.raises(ChangeError, match="SecondArgumentInF declares no DESCRIPTION"):
        codemod.load(d)


def test_a_target_the_fix_does_not_declare_is_refused(tmp_path):
    with pytest.raises(PermissionError, match="pkg/t.py, which fix.yaml does not declare"):
        codemod.apply(fix(tmp_path), {"pkg/other.py": SRC.encode()})


def test_a_scope_is_all_the_codemod_sees_and_must_exist_once(tmp_path):
    d = fix(tmp_path, fn="f|h")
    text = (d / "codemod.py").read_text().replace("m.Name('f|h')", "m.Name('f') | m.Name('h')")
    (d / "codemod.py").write_text(
        text.replace(
            '    PLACES = ("g\'s second argument",)\n', '    PLACES = ("g\'s second argument",)\n    SCOPE = ("A.h",)\n'
        )
    )
    assert run(d) == SRC.replace("return g(1, 2)\n", "return g(1, 3)\n").replace("return g(1, 3)", "return g(1, 2)", 1)
    (d / "codemod.py").write_text(
        text.replace(
            '    PLACES = ("g\'s second argument",)\n',
            '    PLACES = ("g\'s second argument",)\n    SCOPE = ("A.nope",)\n',
        )
    )
    with pytest.raises(ChangeError, match="A.nope in pkg/t.py: expected exactly one definition, found 0"):
        run(d)


def test_a_scope_is_found_from_the_record_of_these_bytes_without_a_parse(tmp_path, monkeypatch):
    import hashlib

    from fixpack.kinds import edit

    d = fix(tmp_path, fn="f")
    text = (d / "codemod.py").read_text()
    (d / "codemod.py").write_text(
        text.replace(
            '    PLACES = ("g\'s second argument",)\n', '    PLACES = ("g\'s second argument",)\n    SCOPE = ("A.f",)\n'
        )
    )
    first = codemod.apply(d, {"pkg/t.py": SRC.encode()})
    assert first.located == {hashlib.sha256(SRC.encode()).hexdigest(): {"A.f": [2, 3]}}

    def refuse(*_a, **_k):
        raise AssertionError("the module was parsed")

    monkeypatch.setattr(edit, "parse_definitions", refuse)
    again = codemod.apply(d, {"pkg/t.py": SRC.encode()}, known=first.located)
    assert again.outputs == first.outputs and b"g(1, 3)" in again.outputs["pkg/t.py"]


# ---- dispatch: libcst's own, public API only

MANY = """
import libcst as cst
import libcst.matchers as m
from fixpack.kinds.codemod import Codemod


class Many(Codemod):
    DESCRIPTION = "every way a codemod names what it acts on"
    TARGET = "pkg/t.py"
    PLACES = ("either", "not in h", "a visit", "a comparison")

    def __init__(self, skip=None):
        super().__init__(skip)
        self.names = 0

    @m.call_if_inside(m.FunctionDef(name=m.Name("f")))
    @m.leave(m.Integer("1") | m.SimpleString())
    def either(self, original, updated):
        return self.at("either", updated, updated)

    @m.call_if_not_inside(m.FunctionDef(name=m.Name("h")))
    @m.leave(m.Call(func=m.Name("g")))
    def not_in_h(self, original, updated):
        return self.at("not in h", updated, updated.with_changes(func=cst.Name("k")))

    @m.visit(m.Return())
    def a_visit(self, node):
        self.at("a visit", node, node)

    def leave_Comparison(self, original, updated):
        return self.at("a comparison", updated, updated)

    def visit_Name(self, node):
        self.names += 1
"""

MANY_SRC = """class A:
    def f(self):
        return g(1, "2")

    def h(self):
        x = 3 < 4
        return g(5, 6)
"""

# a call_if_inside matcher that names no node class of its own (m.TypeOf)
ANY = (
    "\n    @m.call_if_inside(m.TypeOf(m.FunctionDef, m.Lambda))\n    @m.leave(m.Integer())\n"
    "    def anything(self, original, updated):\n        return updated\n"
)


@pytest.mark.parametrize("extra", ["", ANY], ids=["node matchers", "with a TypeOf matcher"])
def test_a_codemod_that_acts_on_some_node_types_finds_each_of_them_wherever_it_sits(tmp_path, extra):
    d = tmp_path / "fix"
    d.mkdir()
    (d / "codemod.py").write_text(MANY + extra)
    import libcst as cst

    class Names(cst.CSTVisitor):
        count = 0

        def visit_Name(self, node):
            self.count += 1

    every = Names()
    cst.parse_module(MANY_SRC).visit(every)
    (cls,) = codemod.load(d)
    inst = cls()
    out = cst.parse_module(MANY_SRC).visit(inst).code
    assert out == MANY_SRC.replace('return g(1, "2")', 'return k(1, "2")')  # g's call in f, not the one inside h
    assert dict(inst.found) == {"either": 2, "not in h": 1, "a visit": 2, "a comparison": 1}
    assert inst.names == every.count == 8  # a visit_ method sees every node of its type, nested or not


def test_codemod_reads_no_private_attribute_of_libcst():
    """A Codemod is a libcst transformer, so even a ``self._name`` of its own lives in libcst's
    private namespace: the kind's module has no ``._name`` at all, nor a ``"_name"`` to getattr."""
    import ast

    tree = ast.parse(Path(codemod.__file__).read_text())
    private = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"))
        or (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("_")
            and not node.value.startswith("__")
        )
        or (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("libcst._"))
    ]
    assert private == []
