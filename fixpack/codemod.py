"""The codemod kind of fix: libcst rewrites anchored on named definitions.

A fix's ``codemod.py`` defines one or more subclasses of :class:`Rewrite`. Each names the
file it edits (``target``, as ``package/path/in/package.py``, one of the fix's declared
targets) and the definitions it rewrites (``nodes``: dotted qualified names of classes,
functions or methods, e.g. ``"InputBatch.make_selective_sampling_metadata"``). The engine
finds each name in the module; zero or several matches is an error. ``rewrite`` returns the
new node. The output must parse, byte-compile, and be a fixed point: running the codemod on
its own output changes nothing.

Most fixes only need :func:`replace_once` inside ``rewrite``: an exact, single text edit
within one definition, so the anchor is the function and not a line number.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import libcst as cst

from fixpack.errors import FixFailed


class Rewrite:
    """Base class of a codemod rewrite. Subclass it in a fix's codemod.py."""

    target: str = ""
    nodes: tuple[str, ...] | list[str] = ()

    def rewrite(self, qualname: str, node: cst.CSTNode) -> cst.CSTNode:  # pragma: no cover
        raise NotImplementedError


class RewriteError(FixFailed):
    pass


def node_code(node: cst.CSTNode) -> str:
    return cst.Module(body=[node]).code if isinstance(node, cst.BaseStatement) else cst.Module([]).code_for_node(node)


def replace_once(node: cst.BaseStatement, old: str, new: str, *, what: str = "") -> cst.BaseStatement:
    """Replace the text ``old`` by ``new`` inside one definition, exactly once.

    Already applied (``new`` present once, ``old`` gone or only inside ``new``) returns the
    node unchanged, which keeps codemods idempotent. Anything else is an error.
    """
    code = node_code(node)
    label = what or getattr(getattr(node, "name", None), "value", "node")
    if new and code.count(new) == 1 and code.replace(new, "").count(old) == 0:
        return node
    count = code.count(old)
    if count != 1:
        raise RewriteError(f"{label}: expected the text to replace exactly once, found it {count} times: {old.strip()[:80]!r}")
    replaced = cst.parse_statement(code.replace(old, new))
    # Re-parsing would re-indent the blank lines above a method; keep them exactly as they were.
    if hasattr(node, "leading_lines") and hasattr(replaced, "leading_lines"):
        replaced = replaced.with_changes(leading_lines=node.leading_lines)
    return replaced


def _walk_defs(body: Iterable[cst.CSTNode], prefix: str, out: dict[str, list[tuple]]):
    for index, stmt in enumerate(body):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            name = f"{prefix}{stmt.name.value}"
            out.setdefault(name, []).append(stmt)
            if isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
                _walk_defs(stmt.body.body, name + ".", out)
        elif isinstance(stmt, cst.If):
            # definitions under `if TYPE_CHECKING:` / version guards keep their plain names
            for block in (stmt.body, stmt.orelse.body if stmt.orelse else None):
                if isinstance(block, cst.IndentedBlock):
                    _walk_defs(block.body, prefix, out)


def find_defs(module: cst.Module) -> dict[str, list[cst.CSTNode]]:
    out: dict[str, list[cst.CSTNode]] = {}
    _walk_defs(module.body, "", out)
    return out


class _Replacer(cst.CSTTransformer):
    def __init__(self, replacements: dict[int, cst.CSTNode]):
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        new = self.replacements.get(id(original_node))
        return new if new is not None else updated_node


def load_rewrites(codemod_file: Path) -> list[type[Rewrite]]:
    name = f"fixpack_codemod_{abs(hash(str(codemod_file)))}"
    spec = importlib.util.spec_from_file_location(name, codemod_file)
    if spec is None or spec.loader is None:
        raise RewriteError(f"{codemod_file}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, Rewrite) and obj is not Rewrite and obj.__module__ == name
    ]
    if not found:
        raise RewriteError(f"{codemod_file}: defines no Rewrite subclass")
    return found


@dataclass
class CodemodResult:
    text: str
    rewritten: list[str]


def _ast_defs(body: list, prefix: str, out: dict[str, list]) -> None:
    """The same walk as ``_walk_defs``, over ``ast`` (module, class bodies, if/else blocks)."""
    import ast

    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{stmt.name}"
            out.setdefault(name, []).append(stmt)
            if isinstance(stmt, ast.ClassDef):
                _ast_defs(stmt.body, name + ".", out)
        elif isinstance(stmt, ast.If):
            _ast_defs(stmt.body, prefix, out)
            if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If) and stmt.orelse[0].col_offset == stmt.col_offset and _is_elif(stmt):
                _ast_defs(stmt.orelse[0].body, prefix, out)  # `elif`: libcst's orelse is that If
            else:
                _ast_defs(stmt.orelse, prefix, out)


def _is_elif(stmt) -> bool:
    # ast cannot tell `elif x:` from `else:\n    if x:`; the latter nests one level deeper.
    return stmt.orelse[0].col_offset == stmt.col_offset


def _default_indent(lines: list[str]) -> str:
    """The relative indent of the file's first indented block (libcst's default_indent)."""
    prev = None
    for line in lines:
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        ind = line[: len(line) - len(line.lstrip(" \t"))]
        if prev is not None and prev[1].endswith(":") and len(ind) > len(prev[0]) and ind.startswith(prev[0]):
            return ind[len(prev[0]) :]
        prev = (ind, body.split("#")[0].rstrip())
    return "    "


def _lines(text: str) -> list[str]:
    # Split on "\n" only, as ast numbers lines (not str.splitlines' form feeds or U+2028).
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _rewrite_span(inst: Rewrite, qualname: str, lines: list[str], node) -> str:
    """Parse only the definition's own lines with libcst (inside an `if True:` that keeps its
    indentation), let the rewrite change it, and return its new text."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    snippet = "".join(lines[first - 1 : node.end_lineno])
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip(" \t"))]
    # libcst stores block indents relative to the module's default indent, which it takes from
    # the first indented block: a leading dummy block gives the snippet the file's default.
    lead = f"if True:\n{_default_indent(lines)}pass\n"
    wrapped = lead + (f"if True:\n{snippet}" if indent else snippet)
    if not wrapped.endswith("\n"):
        wrapped += "\n"
    module = cst.parse_module(wrapped)
    dummy, holder = module.body[0], module.body[1]
    original = holder.body.body[0] if indent else holder
    new = inst.rewrite(qualname, original)
    if not isinstance(new, cst.CSTNode):
        raise RewriteError(f"{type(inst).__name__}.rewrite({qualname}) returned {type(new).__name__}, not a libcst node")
    if indent:
        module = module.with_changes(body=[dummy, holder.with_changes(body=holder.body.with_changes(body=[new]))])
        text = module.code[len(lead) + len("if True:\n") :]
    else:
        text = module.with_changes(body=[dummy, new]).code[len(lead) :]
    if not snippet.endswith("\n") and text.endswith("\n"):
        text = text[:-1]
    return text


def apply_rewrites(rewrites: list[type[Rewrite]], target: str, source: str) -> CodemodResult:
    """Run every rewrite aimed at ``target`` over ``source`` and return the new text.

    Definitions are located with ``ast`` and only their own lines are parsed with libcst: a
    whole-module libcst parse of a 400 KB runner costs seconds per fix; the text around the
    rewritten definition is kept byte for byte either way.
    """
    import ast

    text = source
    done: list[str] = []
    for cls in rewrites:
        if cls.target != target:
            continue
        inst = cls()
        if not cls.nodes:
            raise RewriteError(f"{cls.__name__}: declares no nodes to rewrite")
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            raise RewriteError(f"{target} does not parse: {exc.msg} at line {exc.lineno}") from exc
        defs: dict[str, list] = {}
        _ast_defs(tree.body, "", defs)
        lines = _lines(text)
        spans = []
        for qualname in cls.nodes:
            matches = defs.get(qualname, [])
            if len(matches) != 1:
                raise RewriteError(
                    f"{cls.__name__}: {qualname} in {target}: expected exactly one definition, found {len(matches)}"
                )
            node = matches[0]
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            spans.append((first, node.end_lineno, qualname, node))
            done.append(qualname)
        spans.sort()
        for (a0, a1, qa, _), (b0, _, qb, _) in zip(spans, spans[1:]):
            if b0 <= a1:
                raise RewriteError(f"{cls.__name__}: {qa} and {qb} overlap; rewrite the outer one only")
        for first, last, qualname, node in reversed(spans):
            new_text = _rewrite_span(inst, qualname, lines, node)
            lines[first - 1 : last] = _lines(new_text) if new_text else []
        text = "".join(lines)
    return CodemodResult(text, done)


def apply_rewrites_whole_module(rewrites: list[type[Rewrite]], target: str, source: str) -> CodemodResult:
    """The straightforward form (whole-module libcst parse and visit), kept as the oracle that
    tests compare ``apply_rewrites`` against."""
    module = cst.parse_module(source)
    done: list[str] = []
    for cls in rewrites:
        if cls.target != target:
            continue
        inst = cls()
        if not cls.nodes:
            raise RewriteError(f"{cls.__name__}: declares no nodes to rewrite")
        defs = find_defs(module)
        replacements: dict[int, cst.CSTNode] = {}
        for qualname in cls.nodes:
            matches = defs.get(qualname, [])
            if len(matches) != 1:
                raise RewriteError(
                    f"{cls.__name__}: {qualname} in {target}: expected exactly one definition, found {len(matches)}"
                )
            new = inst.rewrite(qualname, matches[0])
            if not isinstance(new, cst.CSTNode):
                raise RewriteError(f"{cls.__name__}.rewrite({qualname}) returned {type(new).__name__}, not a libcst node")
            replacements[id(matches[0])] = new
            done.append(qualname)
        module = module.visit(_Replacer(replacements))
    return CodemodResult(module.code, done)
