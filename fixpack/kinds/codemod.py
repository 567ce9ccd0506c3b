"""The codemod kind: codemod.py, LibCST transformers written with matchers.

For a change whose place is a structure rather than a text: an argument of a call, an
assignment, a condition, a guard at the top of a function. A fix's ``codemod.py`` defines
one or more subclasses of :class:`Codemod` (a ``libcst.matchers.MatcherDecoratableTransformer``),
in the style of LibCST's own codemod commands::

    class FirstRowOnly(Codemod):
        DESCRIPTION = "A seeded generator drives only its request's first row."
        TARGET = "vllm_gaudi/v1/worker/hpu_input_batch.py"
        PLACES = ("generators argument",)
        SCOPE = ("InputBatch.make_selective_sampling_metadata",)

        @m.call_if_inside(m.FunctionDef(name=m.Name("make_selective_sampling_metadata")))
        @m.leave(m.Arg(keyword=m.Name("generators"), value=m.DictComp()))
        def first_row_map(self, original, updated):
            return self.at("generators argument", updated, updated.with_changes(value=cst.Name("generators")))

``PLACES`` names the places the transformer changes; each handler reports its place with
:meth:`Codemod.at`, also when it finds the change already made (it then returns the node
as it is, which keeps the codemod idempotent). Each place must be found exactly once in the
target, or the fix fails with the count it found: a place found 0 times is a conflict, as a
diff's hunk that no longer applies. Every class targeting a file runs on it in order; a class
with a SCOPE has only those definitions parsed, one without has the whole module parsed. The
code outside the changed nodes is printed back byte for byte (LibCST keeps all whitespace and
comments).
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from typing import ClassVar, TypeVar

import libcst as cst
import libcst.matchers as m

from fixpack.kinds import CODEMOD
from fixpack.kinds.base import Applied, ChangeError, Rebased, added_by_texts, check_declared, rebase_by_apply

CHANGE_FILE = CODEMOD.change_file

N = TypeVar("N", bound=cst.CSTNode)


class Codemod(m.MatcherDecoratableTransformer):
    """Base class of a fix's transformer. Subclass it in the fix's codemod.py.

    Its dispatch is libcst's own: every node the transformer visits goes through every matcher
    of its decorators. Only libcst's public API is used, so that a libcst release that renames
    an internal cannot change which nodes a codemod sees; SCOPE is what keeps the visit short."""

    DESCRIPTION: ClassVar[str] = ""
    TARGET: ClassVar[str] = ""  # the file it edits, package/path (a declared target of the fix)
    PLACES: ClassVar[tuple[str, ...]] = ()  # what it changes, one name per place
    # The definitions its places are in, by qualified name (``Class.method``, found with ast
    # exactly once, as an edit's ``in``). Only they are parsed and visited: libcst takes seconds
    # to parse a 400 KB module and well under one for a method. Empty: the whole module.
    SCOPE: ClassVar[tuple[str, ...]] = ()

    def __init__(self, skip: str | None = None) -> None:
        super().__init__()
        self.found: Counter[str] = Counter()
        self.skip = skip  # a place left as it is (fixpack check: every part necessary)

    def at(self, place: str, updated: N, new: cst.CSTNode) -> cst.CSTNode:
        """Record that ``place`` was found; give back ``new`` (``updated`` if the place is skipped)."""
        if place not in self.PLACES:
            raise ChangeError(f"{type(self).__name__}: place {place!r} is not one of its PLACES {self.PLACES}")
        if not isinstance(new, cst.CSTNode):
            raise ChangeError(f"{type(self).__name__} at {place!r} returned {type(new).__name__}, not a libcst node")
        self.found[place] += 1
        return updated if place == self.skip else new


def comment_lines(*comments: str) -> list[cst.EmptyLine]:
    """Comment lines to put above a statement, at its indentation."""
    return [cst.EmptyLine(indent=True, comment=cst.Comment(c)) for c in comments]


def statements(code: str) -> list[cst.BaseStatement]:
    """Statements parsed from ``code`` (written at column 0), comments above each kept."""
    module = cst.parse_module(code)
    body: list[cst.BaseStatement] = list(module.body)
    first = body[0] if body else None
    if isinstance(first, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and module.header:
        # comments before the first statement land in the module's header: give them back to it
        body[0] = first.with_changes(leading_lines=[*module.header, *first.leading_lines])
    return body


def load(fix_dir: Path) -> list[type[Codemod]]:
    path = fix_dir / CHANGE_FILE
    name = f"fixpack_codemod_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ChangeError(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, Codemod) and obj.__module__ == name
    ]
    if not found:
        raise ChangeError(f"{path}: defines no Codemod subclass")
    for cls in found:
        for attr in ("DESCRIPTION", "TARGET", "PLACES"):
            if not getattr(cls, attr):
                raise ChangeError(f"{path}: {cls.__name__} declares no {attr}")
    return found


def _parse(code: str, what: str) -> cst.Module:
    try:
        return cst.parse_module(code)
    except cst.ParserSyntaxError as exc:
        raise ChangeError(f"{what} does not parse: {exc.message} at line {exc.raw_line}") from exc


def _scope_spans(
    cls: type[Codemod], rel: str, text: str, where: str, known: dict | None, located: dict
) -> list[tuple[int, int]]:
    """Where each definition of ``cls.SCOPE`` sits in ``text`` (character offsets, bottom first),
    found as an edit finds its definitions (fixpack.kinds.edit.locate)."""
    from fixpack.kinds.edit import line_starts, locate

    lines = locate(text, rel, cls.SCOPE, f"{where}: {cls.__name__}", known, located)
    starts = line_starts(text)
    return sorted(((starts[first - 1], min(starts[last], len(text))) for first, last in lines.values()), reverse=True)


def _visit_definition(inst: Codemod, code: str, what: str) -> str:
    """A definition's text (its lines, as they sit in the file) through the transformer. A
    method is parsed under ``class _:`` headers, one per level, so that no line of it (nor of
    a string in it) moves; what comes back is its text again, the headers taken off."""
    indent = len(code) - len(code.lstrip(" "))
    if indent % 4 or code[indent] == "\t":
        raise ChangeError(
            f"{what} is indented by {indent} spaces or a tab; a codemod SCOPE takes 4-space levels (leave SCOPE empty)"
        )
    header = "".join(" " * level + "class _:\n" for level in range(0, indent, 4))
    ends_file = not code.endswith("\n")
    module = _parse(header + code + ("\n" if ends_file else ""), what)
    out = module.visit(inst).code
    if not out.startswith(header):
        raise ChangeError(f"{what}: the codemod changed code outside its SCOPE")
    out = out[len(header) :]
    return out[:-1] if ends_file and out.endswith("\n") else out


def transform(
    classes: list[type[Codemod]],
    rel: str,
    source: str,
    skip: tuple[type, str] | None = None,
    where: str = "",
    known: dict | None = None,
    located: dict | None = None,
) -> str:
    """``source`` with every codemod aimed at ``rel`` run over it, in order, each place found once.
    A codemod with a SCOPE sees only those definitions; one without sees the whole module.
    ``known`` and ``located``: as for fixpack.kinds.edit.locate."""
    located = {} if located is None else located
    text = source
    for cls in classes:
        if cls.TARGET != rel:
            continue
        inst = cls(skip=skip[1] if skip and skip[0] is cls else None)
        if cls.SCOPE:
            for begin, end in _scope_spans(cls, rel, text, where, known, located):
                text = text[:begin] + _visit_definition(inst, text[begin:end], f"{rel} ({cls.__name__})") + text[end:]
        else:
            text = _parse(text, rel).visit(inst).code
        for place in cls.PLACES:
            if inst.found[place] != 1:
                raise ChangeError(
                    f"{where}: {cls.__name__}: {place} in {rel}: expected exactly one place, found {inst.found[place]}"
                )
    return text


def apply(fix_dir: Path, sources: dict[str, bytes], drop: int | None = None, known: dict | None = None) -> Applied:
    where = f"{fix_dir.name}/{CHANGE_FILE}"  # the fix's own name, not where this machine keeps it
    classes = load(fix_dir)
    located: dict = {}
    check_declared(
        where, {cls.TARGET for cls in classes}, set(sources), f"{', '.join(c.__name__ for c in classes)} targets"
    )
    places = [(cls, p) for cls in classes for p in cls.PLACES]
    skip = places[drop] if drop is not None and 0 <= drop < len(places) else None
    outputs = {
        rel: transform(classes, rel, data.decode("utf-8"), skip, where, known, located).encode("utf-8")
        for rel, data in sources.items()
    }
    return Applied(outputs, [f"{cls.__name__}: {p}" for cls, p in places], located)


def rebase(fix, tree: Path) -> Rebased:
    return rebase_by_apply(CODEMOD.name, apply, fix, tree)


def added_lines(fix, tree: Path) -> dict[str, list[str]]:
    """The new lines of the codemod's output where it applies (none where it does not)."""
    import difflib

    sources = {t.rel: (tree / t.rel).read_bytes() for t in fix.targets if (tree / t.rel).is_file()}
    try:
        outputs = apply(fix.change_dir, sources).outputs if len(sources) == len(fix.targets) else {}
    except ChangeError:
        outputs = {}
    calls = []
    for rel, data in outputs.items():
        lines = list(
            difflib.unified_diff(sources[rel].decode().splitlines(), data.decode().splitlines(), lineterm="", n=0)
        )
        old = "\n".join(x[1:] for x in lines if x[:1] == "-" and not x.startswith("---"))
        new = "\n".join(x[1:] for x in lines if x[:1] == "+" and not x.startswith("+++"))
        calls.append((rel, old, new))
    return added_by_texts(calls)


def validate(fix) -> None:
    """The codemod parses; its classes' TARGETs are checked when it runs."""
    import ast

    from fixpack.errors import ConfigError

    try:
        ast.parse(fix.change_file.read_bytes(), str(fix.change_file))
    except SyntaxError as exc:
        raise ConfigError(f"{fix.change_file}: does not parse: {exc.msg} at line {exc.lineno}") from exc
