"""The edit kind: edits.yaml, data and not code. Each edit says: in the file ``target``, inside
the definition ``in`` (a dotted qualified name: ``Class.method``, ``function``), replace the
text ``replace`` by ``with``, exactly once.

The definition is found with ``ast`` (zero or several matches is an error). The texts are
written without their common indentation, as YAML block scalars give them; an edit matches
them at any one indentation inside the definition and writes ``with`` at that same
indentation (so a text cannot reach into the column-0 lines of a multi-line string; make
such a change a diff). Everything outside the replaced text stays byte for byte. An edit whose ``with``
is already there once (and its ``replace`` is not, outside it) changes nothing: edits are
idempotent. Several edits of one definition apply in the order written.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fixpack.kinds import EDIT
from fixpack.kinds.base import (
    Applied,
    ChangeError,
    Rebased,
    added_by_texts,
    check_declared,
    parse_python,
    rebase_by_apply,
)

CHANGE_FILE = EDIT.change_file
KEYS = {
    "target": "the file, package/path",
    "in": "the definition, Class.method or function",
    "replace": "the text to replace",
    "with": "its replacement",
}


@dataclass(frozen=True)
class Edit:
    target: str
    qualname: str
    old: str
    new: str

    @property
    def label(self) -> str:
        first = next((line.strip() for line in self.old.splitlines() if line.strip()), "")
        return f"{self.qualname}: {first[:70]}"


def load(fix_dir: Path) -> list[Edit]:
    """The edits of ``fix_dir/edits.yaml``, checked: a list of mappings with exactly KEYS."""
    from fixpack.pack import schema

    path = fix_dir / CHANGE_FILE
    data = schema.load_yaml(path)
    if not isinstance(data, list) or not data:
        raise ChangeError(f"{path}: must be a non-empty list of edits ({', '.join(KEYS)})")
    edits = []
    for i, item in enumerate(data):
        where = f"{path}: edit {i + 1}"
        if not isinstance(item, dict):
            raise ChangeError(f"{where}: must be a mapping with keys {', '.join(KEYS)}")
        unknown = sorted(set(item) - set(KEYS))
        missing = [k for k in KEYS if k not in item]
        if unknown or missing:
            raise ChangeError(
                f"{where}: "
                + "; ".join(
                    [f"unknown key(s) {', '.join(unknown)}"] * bool(unknown)
                    + [f"missing key(s) {', '.join(missing)}"] * bool(missing)
                )
            )
        for k, what in KEYS.items():
            if not isinstance(item[k], str) or (k != "with" and not item[k].strip()):
                raise ChangeError(f"{where}: key {k!r} ({what}) must be a non-empty string")
        edits.append(Edit(item["target"], item["in"], item["replace"], item["with"]))
    return edits


def definitions(tree: ast.Module) -> dict[str, list]:
    """Every class and function of a module by qualified name (several: a name defined twice)."""
    out: dict[str, list] = {}
    _defs(tree.body, "", out)
    return out


def parse_definitions(text: str, rel: str) -> dict[str, list]:
    """``definitions`` of the module ``text`` (the file ``rel``); a file that does not parse is a ChangeError."""
    try:
        return definitions(parse_python(text))
    except SyntaxError as exc:
        raise ChangeError(f"{rel} does not parse: {exc.msg} at line {exc.lineno}") from exc


def definition_lines(defs: dict[str, list], qualname: str, rel: str, where: str) -> tuple[int, int]:
    """The first line (its decorators included) and the last line of the one definition of
    ``qualname``; none or several is a ChangeError (``where`` says whose)."""
    found = defs.get(qualname, [])
    if len(found) != 1:
        raise ChangeError(f"{where}: {qualname} in {rel}: expected exactly one definition, found {len(found)}")
    node = found[0]
    return min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno


def locate(
    text: str, rel: str, qualnames: Iterable[str], where: str, known: dict | None, located: dict
) -> dict[str, tuple[int, int]]:
    """The first line (decorators included) and the last line of the one definition of each of
    ``qualnames`` in ``text`` (the file ``rel``). Taken from ``known`` when it records this very
    text (by its sha256) and every name: what the lock kept of where the fix found them when
    it was pinned, each checked to start at its definition. Otherwise found with ast, as
    ``definition_lines`` says. Either way the spans are added to ``located`` under the text's hash."""
    names = list(dict.fromkeys(qualnames))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    entry = (known or {}).get(digest) or {}
    if names and all(q in entry for q in names):
        lines = text.split("\n")
        spans = {q: _recorded(entry[q], q, lines, rel, where) for q in names}
    else:
        defs = parse_definitions(text, rel)
        spans = {q: definition_lines(defs, q, rel, where) for q in names}
    located.setdefault(digest, {}).update({q: list(span) for q, span in spans.items()})
    return spans


DEF_LINE = re.compile(r"(async\s+)?(def|class)\s")


def _recorded(span, qualname: str, lines: list[str], rel: str, where: str) -> tuple[int, int]:
    """A span the lock recorded for these bytes, checked to start at the definition (or its
    first decorator) of ``qualname``: a damaged lock fails here, never edits another place."""
    name = re.escape(qualname.rsplit(".", 1)[-1])
    ok = isinstance(span, list) and len(span) == 2 and all(isinstance(n, int) for n in span)
    if ok:
        first, last = span
        ok = 1 <= first <= last <= len(lines)
    if ok:
        # its first line is the definition's, or a decorator above it
        k = first - 1
        while k < last and not DEF_LINE.match(lines[k].lstrip()):
            k += 1
        ok = (k == first - 1 or lines[first - 1].lstrip().startswith("@")) and k < last
        ok = ok and re.match(rf"(async\s+)?(def|class)\s+{name}\b", lines[k].lstrip()) is not None
    if not ok:
        raise ChangeError(
            f"{where}: the lock's record of where {qualname} sits in {rel} ({span!r}) is not its definition; "
            "the lock is damaged: regenerate it with `fixpack lock`"
        )
    return first, last


def line_starts(text: str) -> list[int]:
    """The offset of each line's first character (ast numbers lines from 1), and the end."""
    starts = [0]
    for line in text.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    return starts


def _defs(body: list, prefix: str, out: dict[str, list]) -> None:
    """Every class and function by qualified name, through class bodies and if/else blocks
    (definitions under ``if TYPE_CHECKING:`` or a version guard keep their plain names)."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{stmt.name}"
            out.setdefault(name, []).append(stmt)
            if isinstance(stmt, ast.ClassDef):
                _defs(stmt.body, name + ".", out)
        elif isinstance(stmt, ast.If):
            _defs(stmt.body, prefix, out)
            _defs(stmt.orelse, prefix, out)


def _common_indent(text: str) -> int:
    widths = [len(line) - len(line.lstrip(" ")) for line in text.split("\n") if line.strip()]
    return min(widths, default=0)


def _reindent(text: str, strip: int, add: int) -> str:
    """``text`` with ``strip`` leading spaces taken from, then ``add`` put on, every non-blank line."""
    out = []
    for line in text.split("\n"):
        if line.strip():
            line = " " * add + line[min(strip, len(line) - len(line.lstrip(" "))) :]
        out.append(line)
    return "\n".join(out)


def _indents(code: str) -> list[int]:
    return sorted({len(line) - len(line.lstrip(" ")) for line in code.split("\n") if line.strip()})


def _count(code: str, text: str) -> int:
    # anchored at line starts: "    x" inside "        x" is not a match one level up
    return ("\n" + code).count("\n" + text)


def replace_once(code: str, edit: Edit, where: str) -> str:
    """``code`` (a definition's lines) with the edit made; unchanged when already made."""
    strip = _common_indent(edit.old)
    olds = {k: _reindent(edit.old, strip, k) for k in _indents(code)}
    news = {k: _reindent(edit.new, strip, k) for k in olds}
    if edit.new.strip():
        done = [k for k in news if _count(code, news[k])]
        rest = lambda k: ("\n" + code).replace("\n" + news[k], "\n")[1:]  # noqa: E731
        if sum(_count(code, news[k]) for k in done) == 1 and all(_count(rest(k), olds[k]) == 0 for k in done):
            return code
    found = [(k, _count(code, old)) for k, old in olds.items() if _count(code, old)]
    count = sum(n for _, n in found)
    if count != 1:
        raise ChangeError(
            f"{where}: {edit.qualname}: expected the text to replace exactly once, found it {count} times: {edit.old.strip()[:80]!r}"
        )
    k = found[0][0]
    return ("\n" + code).replace("\n" + olds[k], "\n" + news[k], 1)[1:]


def apply(fix_dir: Path, sources: dict[str, bytes], drop: int | None = None, known: dict | None = None) -> Applied:
    where = f"{fix_dir.name}/{CHANGE_FILE}"  # the fix's own name, not where this machine keeps it
    edits = load(fix_dir)
    located: dict = {}
    check_declared(where, {e.target for e in edits}, set(sources), "edits")
    outputs = dict(sources)
    parts = [e.label for e in edits]
    for rel in sources:
        mine = [(i, e) for i, e in enumerate(edits) if e.target == rel]
        text = sources[rel].decode("utf-8")
        spans = locate(text, rel, [e.qualname for _, e in mine], where, known, located)
        ordered = sorted(spans.items(), key=lambda s: s[1])
        for (qa, a), (qb, b) in zip(ordered, ordered[1:], strict=False):
            if b[0] <= a[1]:
                raise ChangeError(f"{where}: {qa} and {qb} in {rel} overlap; edit the inner one only")
        starts = line_starts(text)
        # bottom first, so that the offsets of the definitions above stay true
        for qualname, (first, last) in sorted(spans.items(), key=lambda s: s[1], reverse=True):
            begin, end = starts[first - 1], min(starts[last], len(text))  # with the last line's newline
            code = text[begin:end]
            for i, e in mine:
                if e.qualname == qualname and i != drop:
                    code = replace_once(code, e, where)
            text = text[:begin] + code + text[end:]
        outputs[rel] = text.encode("utf-8")
    return Applied(outputs, parts, located)


def rebase(fix, tree: Path) -> Rebased:
    return rebase_by_apply(EDIT.name, apply, fix, tree)


def added_lines(fix, tree: Path) -> dict[str, list[str]]:
    """Each edit's new text beyond its old text."""
    return added_by_texts([(e.target, e.old, e.new) for e in load(fix.change_dir)])


def validate(fix) -> None:
    from fixpack.errors import ConfigError

    try:
        named = {e.target for e in load(fix.change_dir)}
    except ChangeError as exc:
        raise ConfigError(str(exc)) from exc
    if named != set(fix.target_rels):
        raise ConfigError(f"{fix.change_file}: edits {sorted(named)} but fix.yaml declares {sorted(fix.target_rels)}")
