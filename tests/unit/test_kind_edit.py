"""The edit kind: data located with ast, exact, idempotent, layout-preserving (no libcst)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from fixpack.kinds import edit
from fixpack.kinds.base import ChangeError

SRC = """class A:
    x = 1

    def f(self):
        return 1

    def g(self):
        return 2


def g():
    return 2
"""


def edits(tmp_path: Path, *items: tuple[str, str, str], target: str = "pkg/t.py") -> Path:
    fix = tmp_path / "fix"
    fix.mkdir(exist_ok=True)
    (fix / "edits.yaml").write_text(
        yaml.safe_dump([{"target": target, "in": q, "replace": old, "with": new} for q, old, new in items])
    )
    return fix


def run(fix: Path, src: str, rel: str = "pkg/t.py", drop: int | None = None) -> str:
    return edit.apply(fix, {rel: src.encode()}, drop).outputs[rel].decode()


def test_rewrites_only_the_named_method_and_keeps_blank_lines(tmp_path):
    out = run(edits(tmp_path, ("A.g", "return 2", "return 3")), SRC)
    assert out == SRC.replace("    def g(self):\n        return 2", "    def g(self):\n        return 3")


def test_is_a_fixed_point_of_itself(tmp_path):
    fix = edits(tmp_path, ("A.g", "return 2", "return 2  # fixed"))
    once = run(fix, SRC)
    assert once != SRC and run(fix, once) == once


def test_missing_definition_is_an_error(tmp_path):
    with pytest.raises(ChangeError, match="A.h in pkg/t.py: expected exactly one definition, found 0"):
        run(edits(tmp_path, ("A.h", "x", "y")), SRC)


def test_text_found_twice_is_an_error(tmp_path):
    with pytest.raises(ChangeError, match="exactly once, found it 2 times"):
        run(
            edits(tmp_path, ("A.g", "return 2", "return 9")),
            SRC.replace("        return 2", "        return 2\n        return 2"),
        )


def test_a_target_the_fix_does_not_declare_is_refused(tmp_path):
    with pytest.raises(PermissionError, match="pkg/other.py, which fix.yaml does not declare"):
        run(edits(tmp_path, ("A.g", "return 2", "return 3"), target="pkg/other.py"), SRC)


def test_texts_are_matched_at_any_one_indentation_and_replaced_at_it(tmp_path):
    out = run(edits(tmp_path, ("A.g", "def g(self):\n    return 2\n", "def g(self, y=0):\n    return 2 + y\n")), SRC)
    assert (
        "    def g(self, y=0):\n        return 2 + y\n" in out and out.count("return 2\n") == 1
    )  # the module-level g untouched


def test_a_deeper_line_is_not_a_match_one_level_up(tmp_path):
    src = "def f():\n    if x:\n        y = 1\n    y = 1\n"
    out = run(edits(tmp_path, ("f", "y = 1\n", "y = 2\n")), src.replace("        y = 1\n", "        z = 1\n"))
    assert out == "def f():\n    if x:\n        z = 1\n    y = 2\n"
    with pytest.raises(ChangeError, match="found it 2 times"):
        run(edits(tmp_path, ("f", "y = 1\n", "y = 2\n")), src)


def test_an_edit_left_out_for_the_proof_is_not_made(tmp_path):
    fix = edits(tmp_path, ("A.f", "return 1", "return 10"), ("A.g", "return 2", "return 20"))
    assert run(fix, SRC, drop=0) == SRC.replace("        return 2", "        return 20")
    assert edit.apply(fix, {"pkg/t.py": SRC.encode()}).parts == ["A.f: return 1", "A.g: return 2"]


def test_bad_edit_files_name_the_file_and_the_edit(tmp_path):
    fix = tmp_path / "fix"
    fix.mkdir()
    (fix / "edits.yaml").write_text("- target: pkg/t.py\n  in: A.g\n  replace: x\n")
    with pytest.raises(ChangeError, match=r"edits.yaml: edit 1: missing key\(s\) with"):
        edit.load(fix)
    (fix / "edits.yaml").write_text("- {target: pkg/t.py, in: A.g, replace: x, with: y, by: z}\n")
    with pytest.raises(ChangeError, match=r"edit 1: unknown key\(s\) by"):
        edit.load(fix)


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
        ("guarded", "\t\treturn 0", "\t\treturn 1"),
        ("Outer.Inner", "class Inner:", "class Inner:  # renamed nothing"),
    ],
)
def test_edits_reach_decorated_nested_async_and_guarded_definitions_and_change_nothing_else(tmp_path, node, old, new):
    out = run(edits(tmp_path, (node, old, new)), TRICKY)
    assert out != TRICKY and new in out
    assert out.replace(new, old, 1) == TRICKY  # byte for byte, the rest as it was


def test_edits_never_import_libcst(tmp_path):
    sys.modules.pop("libcst", None)
    run(edits(tmp_path, ("A.g", "return 2", "return 3")), SRC)
    assert "libcst" not in sys.modules


def _no_parse(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the module was parsed")

    monkeypatch.setattr(edit, "parse_definitions", refuse)


def test_where_it_found_a_definition_is_recorded_by_the_text_hash_and_used_again_without_a_parse(tmp_path, monkeypatch):
    import hashlib

    fix = edits(tmp_path, ("A.g", "return 2", "return 3"))
    first = edit.apply(fix, {"pkg/t.py": SRC.encode()})
    digest = hashlib.sha256(SRC.encode()).hexdigest()
    assert first.located == {digest: {"A.g": [7, 8]}}  # "def g" and "return 2" of class A
    _no_parse(monkeypatch)
    again = edit.apply(fix, {"pkg/t.py": SRC.encode()}, known=first.located)
    assert again.outputs == first.outputs
    # a record of other bytes is not used: these are parsed (and the refusing parser says so)
    other = SRC.replace("x = 1", "x = 2").encode()
    with pytest.raises(AssertionError, match="parsed"):
        edit.apply(fix, {"pkg/t.py": other}, known=first.located)


@pytest.mark.parametrize("span", [[4, 5], [1, 2], [7, 99], [8, 7], "7-8", [7]])
def test_a_damaged_record_is_refused_never_used_to_edit_another_place(tmp_path, span):
    import hashlib

    fix = edits(tmp_path, ("A.g", "return 2", "return 3"))
    known = {hashlib.sha256(SRC.encode()).hexdigest(): {"A.g": span}}
    # [4, 5] is A.f (def f, not def g); [1, 2] is class A; the rest are not spans of this text
    with pytest.raises(ChangeError, match=r"the lock's record of where A.g sits in pkg/t.py .* regenerate it"):
        edit.apply(fix, {"pkg/t.py": SRC.encode()}, known=known)
