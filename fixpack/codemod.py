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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fixpack.errors import FixFailed

if TYPE_CHECKING:
    import libcst as cst

# libcst is imported where a tree is needed, not here: a pinned run edits definitions as text
# (see apply_rewrites) and need not pay for importing it.


class Rewrite:
    """Base class of a codemod rewrite. Subclass it in a fix's codemod.py."""

    target: str = ""
    nodes: tuple[str, ...] | list[str] = ()

    def rewrite(self, qualname: str, node: Any) -> Any:  # pragma: no cover - a libcst node, or DefinitionText in a pinned run
        raise NotImplementedError


class RewriteError(FixFailed):
    pass


# Code already known for a node, keyed by its type and the identities of its fields: nodes are
# immutable, so a copy that shares every child (``with_changes(leading_lines=...)`` putting back
# the same lines) renders the same. The node is kept so that its ids stay taken.
_KNOWN_CODE: dict[tuple, tuple[cst.CSTNode, str]] = {}


def _code_key(node: cst.CSTNode) -> tuple:
    return (type(node), *(id(getattr(node, f)) for f in node.__dataclass_fields__))


def node_code(node: cst.CSTNode) -> str:
    known = _KNOWN_CODE.get(_code_key(node))
    if known is not None:
        return known[1]
    import libcst as cst

    return cst.Module(body=[node]).code if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) else cst.Module([]).code_for_node(node)


class NeedsTree(Exception):
    """A rewrite used more of a definition than its text: parse it with libcst after all."""


class DefinitionText:
    """A definition as its text, handed to a rewrite in a pinned run (see ``apply_rewrites``).

    ``replace_once`` edits it as text, which is what it does to a libcst node too (print,
    replace, parse again). Anything else a rewrite asks of it raises ``NeedsTree``, and the
    definition is parsed with libcst and rewritten again."""

    leading_lines = ()  # a definition parsed alone has none

    def __init__(self, code: str, label: str):
        self.code = code
        self.label = label

    def with_changes(self, **changes):
        if changes == {"leading_lines": ()}:
            return self
        raise NeedsTree(f"with_changes({', '.join(changes)})")

    def __getattr__(self, name):
        raise NeedsTree(name)


def dedent(text: str, by: int) -> str:
    """``text`` with ``by`` leading spaces taken from every line that has them."""
    pad = " " * by
    return "\n".join(line[by:] if line.startswith(pad) else line for line in text.split("\n"))


def replace_once(node: Any, old: str, new: str, *, indent: int = 0, what: str = "") -> Any:
    """Replace the text ``old`` by ``new`` inside one definition, exactly once.

    ``indent``: the snippets are written as they sit in the file, where the definition is
    ``indent`` columns deep (a method: 4); the definition's own text starts at column 0.
    Already applied (``new`` present once, ``old`` gone or only inside ``new``) returns the
    node unchanged, which keeps codemods idempotent. Anything else is an error. The blank
    lines above the definition are kept as they were.
    """
    if indent:
        old, new = dedent(old, indent), dedent(new, indent)
    as_text = isinstance(node, DefinitionText)
    code = node.code if as_text else node_code(node)
    label = what or (node.label if as_text else getattr(getattr(node, "name", None), "value", "node"))
    if new and code.count(new) == 1 and code.replace(new, "").count(old) == 0:
        return node
    count = code.count(old)
    if count != 1:
        raise RewriteError(f"{label}: expected the text to replace exactly once, found it {count} times: {old.strip()[:80]!r}")
    if as_text:
        return DefinitionText(code.replace(old, new), label)
    import libcst as cst

    text = code.replace(old, new)
    replaced = cst.parse_statement(text)
    # Re-parsing would re-indent the blank lines above a method; keep them exactly as they were.
    if hasattr(node, "leading_lines") and hasattr(replaced, "leading_lines"):
        replaced = replaced.with_changes(leading_lines=node.leading_lines)
    # At module level blank lines carry no indentation, so the node renders as the text it was
    # parsed from: the next edit of it needs no code generation.
    _KNOWN_CODE[_code_key(replaced)] = (replaced, text)
    return replaced


def _walk_defs(body: Iterable[cst.CSTNode], prefix: str, out: dict[str, list[Any]]):
    import libcst as cst

    for stmt in body:
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
    anchors: dict = field(default_factory=dict)


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


def _string_interiors(text: str) -> set[int] | None:
    """0-based indexes of lines that continue a string begun on an earlier line (their
    indentation is the string's content); None when ``text`` does not tokenize."""
    if '"""' not in text and "'''" not in text and "\\\n" not in text:
        return set()
    import io
    import tokenize

    inside: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)) and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0], tok.end[0]))  # rows start..end-1 are 1-based: lines start+1..end
    except (tokenize.TokenError, SyntaxError):
        return None
    return inside


def _shift(text: str, indent: str, out: bool) -> str | None:
    """Move a definition between its place in the file (``indent``) and column 0, leaving
    string contents and empty lines alone; None when a line does not fit that shape."""
    lines = _lines(text)
    inside = _string_interiors(text if out else "".join(lines))
    if inside is None:
        return None
    res = []
    for i, line in enumerate(lines):
        if i in inside or line in ("\n", ""):
            res.append(line)
        elif out:
            if not line.startswith(indent):
                return None
            res.append(line[len(indent) :])
        else:
            res.append(indent + line)
    return "".join(res)


def _rewrite_as_text(inst: Rewrite, qualname: str, snippet: str, indent: str) -> str | None:
    """The rewrite applied to the definition's text, or None where it needs the libcst tree."""
    top = _shift(snippet, indent, out=True) if indent else snippet
    if top is None or (indent and _shift(top, indent, out=False) != snippet):
        return None
    try:
        new = inst.rewrite(qualname, DefinitionText(top, qualname.rsplit(".", 1)[-1]))
    except Exception:  # NeedsTree, or anything else: the libcst run gives the real answer
        return None
    if not isinstance(new, DefinitionText):
        return None
    return _shift(new.code, indent, out=False) if indent else new.code


def _rewrite_span(inst: Rewrite, qualname: str, lines: list[str], first: int, last: int, as_text: bool = False) -> str:
    """Parse only the definition's own lines with libcst (inside an `if True:` that keeps its
    indentation), let the rewrite change it, and return its new text. With ``as_text``, first
    try the rewrite on the definition's text alone (the caller checks the result's hash)."""
    snippet = "".join(lines[first - 1 : last])
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip(" \t"))]
    if as_text:
        text = _rewrite_as_text(inst, qualname, snippet, indent)
        if text is not None:
            return text
    # libcst stores block indents relative to the module's default indent, which it takes from
    # the first indented block: a leading dummy block gives the snippet the file's default.
    lead = f"if True:\n{_default_indent(lines)}pass\n"
    wrapped = lead + (f"if True:\n{snippet}" if indent else snippet)
    if not wrapped.endswith("\n"):
        wrapped += "\n"
    import libcst as cst

    module = cst.parse_module(wrapped)
    dummy = module.body[0]
    holder: Any = module.body[1]  # the `if True:` block that keeps a method's indentation, or the definition
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


def _locate(classes: list[type[Rewrite]], target: str, text: str, anchors: dict | None = None) -> list[tuple]:
    """(first line, last line, qualname, class) of every definition the classes rewrite.

    Found with one ``ast`` parse of ``text``, zero or several matches being an error; or taken
    from ``anchors`` ({qualname: [first, last]}, recorded by the lock for these exact bytes,
    which the driver has hash-checked), when they name every definition.
    """
    wanted = [(cls, q) for cls in classes for q in cls.nodes]
    for cls in classes:
        if not cls.nodes:
            raise RewriteError(f"{cls.__name__}: declares no nodes to rewrite")
    if anchors and all(q in anchors for _, q in wanted):
        lines = _lines(text)
        spans = []
        for cls, q in wanted:
            first, last = anchors[q]
            head = lines[first - 1].lstrip() if 0 < first <= last <= len(lines) else ""
            if not head.startswith(("@", f"def {q.rsplit('.', 1)[-1]}", f"async def {q.rsplit('.', 1)[-1]}", f"class {q.rsplit('.', 1)[-1]}")):
                raise RewriteError(f"{cls.__name__}: {q} in {target}: the lock's anchor (lines {first}-{last}) is not that definition; run `fixpack lock`")
            spans.append((first, last, q, cls))
        return spans
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise RewriteError(f"{target} does not parse: {exc.msg} at line {exc.lineno}") from exc
    defs: dict[str, list] = {}
    _ast_defs(tree.body, "", defs)
    spans = []
    for cls, qualname in wanted:
        matches = defs.get(qualname, [])
        if len(matches) != 1:
            raise RewriteError(f"{cls.__name__}: {qualname} in {target}: expected exactly one definition, found {len(matches)}")
        node = matches[0]
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        spans.append((first, node.end_lineno, qualname, cls))
    return spans


def _overlap(spans: list[tuple]) -> tuple | None:
    ordered = sorted(spans, key=lambda s: s[:2])
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b[0] <= a[1]:
            return a, b
    return None


def apply_rewrites(rewrites: list[type[Rewrite]], target: str, source: str, anchors: dict | None = None, as_text: bool = False) -> CodemodResult:
    """Run every rewrite aimed at ``target`` over ``source`` and return the new text.

    Definitions are located with ``ast`` (or the lock's anchors for these bytes) and only their
    own lines are parsed with libcst: a whole-module libcst parse of a 400 KB runner costs
    seconds per fix; the text around the rewritten definition is kept byte for byte either
    way. Rewrites of disjoint definitions commute, so one location serves all the classes of a
    fix; when two classes touch the same definition, each runs on the text the previous left.
    The result's ``anchors`` are the definitions located in ``source`` (for the lock).

    ``as_text`` (a pinned run, whose caller checks the output against its pin and runs again
    without it on a mismatch): a rewrite that only uses ``replace_once`` gets the definition's
    text and skips libcst's parse and print, which give back the same text anyway.
    """
    classes = [cls for cls in rewrites if cls.target == target]
    done = [q for cls in classes for q in cls.nodes]
    if not classes:
        return CodemodResult(source, [])
    spans = _locate(classes, target, source, anchors)
    clash = _overlap(spans)
    if clash is not None and clash[0][3] is clash[1][3]:
        raise RewriteError(f"{clash[0][3].__name__}: {clash[0][2]} and {clash[1][2]} overlap; rewrite the outer one only")
    located = {}
    groups: list[tuple[list, list | None]]
    if clash is None:
        groups = [(classes, spans)]
        located = {q: [first, last] for first, last, q, _ in spans}
    else:
        groups = [([cls], None) for cls in classes]
    text = source
    for group, found in groups:
        found = found if found is not None else _locate(group, target, text)
        clash = _overlap(found)
        if clash is not None:
            raise RewriteError(f"{clash[0][3].__name__}: {clash[0][2]} and {clash[1][2]} overlap; rewrite the outer one only")
        lines = _lines(text)
        insts = {cls: cls() for cls in group}
        for first, last, qualname, cls in sorted(found, key=lambda s: s[0], reverse=True):
            new_text = _rewrite_span(insts[cls], qualname, lines, first, last, as_text)
            lines[first - 1 : last] = _lines(new_text) if new_text else []
        text = "".join(lines)
    return CodemodResult(text, done, located)


def apply_rewrites_whole_module(rewrites: list[type[Rewrite]], target: str, source: str) -> CodemodResult:
    """The straightforward form (whole-module libcst parse and visit), kept as the oracle that
    tests compare ``apply_rewrites`` against."""
    import libcst as cst

    class _Replacer(cst.CSTTransformer):
        def __init__(self, replacements: dict[int, cst.CSTNode]):
            self.replacements = replacements

        def on_leave(self, original_node, updated_node):
            new = self.replacements.get(id(original_node))
            return new if new is not None else updated_node

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
