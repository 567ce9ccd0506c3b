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


def apply_rewrites(rewrites: list[type[Rewrite]], target: str, source: str) -> CodemodResult:
    """Run every rewrite aimed at ``target`` over ``source`` and return the new text."""
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
