"""What every kind module provides (KindModule), what it returns, and its error."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fixpack.errors import FixFailed

# CPython 3.11 keeps ast.parse's object-conversion depth in state shared by threads, and
# `fixpack check` proves parts in a thread pool: two parses at once can raise "SystemError: AST
# constructor recursion depth mismatch" (python/cpython gh-106905). Parses take turns.
_PARSE_LOCK = threading.Lock()


def parse_python(source: str | bytes) -> ast.Module:
    """``ast.parse(source)``, one thread at a time."""
    with _PARSE_LOCK:
        return ast.parse(source)


class ChangeError(FixFailed):
    """The change does not fit the file: its place is not found exactly once, or it is malformed."""


@dataclass
class Applied:
    outputs: dict[str, bytes]  # every declared target, changed or not
    parts: list[str] = field(default_factory=list)  # one label per hunk / edit / codemod place
    # Where the definitions an edit or a codemod's SCOPE names sit, for each text it located
    # them in: {sha256 of the text: {qualname: [first line, last line]}}. The lock keeps it per
    # fix, so that an apply on the pinned bytes need not parse a whole module to find them.
    located: dict[str, dict[str, list[int]]] = field(default_factory=dict)


# a fix on another release's tree: (class, new file contents, notes, refreshed change); the
# classes are those of fixpack.proofs.rebase ("exact", "offset", "conflict", "nomatch", "upstream")
Rebased = tuple[str, dict[str, bytes], list[str], str]


class KindModule(Protocol):
    """The operations of a kind, one module each (``fixpack.kinds.<name>``); ``fix`` is a
    fixpack.pack.pack.Fix of that kind, ``tree`` a release's tree holding its targets."""

    def apply(
        self, fix_dir: Path, sources: dict[str, bytes], drop: int | None = None, known: dict | None = None
    ) -> Applied: ...

    def rebase(self, fix, tree: Path) -> Rebased: ...

    def added_lines(self, fix, tree: Path) -> dict[str, list[str]]: ...

    def validate(self, fix) -> None: ...


def rebase_by_apply(kind: str, apply: Callable[..., Applied], fix, tree: Path) -> Rebased:
    """A kind located by definition, not by line, on another release: it applies there as it
    is, or its place is not found (nomatch) or is ambiguous (conflict), or it changes nothing
    (upstream: the fixed code is already there). Nothing to refresh."""
    sources = {t.rel: (tree / t.rel).read_bytes() for t in fix.targets}
    try:
        changes = apply(fix.change_dir, sources).outputs
    except ChangeError as exc:
        msg = str(exc)
        return ("nomatch" if "found 0" in msg else "conflict"), {}, [msg], ""
    same = all(changes[rel] == sources[rel] for rel in sources)
    note = [f"the {kind} changes nothing: the fixed code is already there"] if same else []
    return ("upstream" if same else "exact"), ({} if same else changes), note, ""


def significant(line: str) -> str | None:
    """An added line worth looking for: code, not blank, not a comment, not a lone keyword or
    bracket (``return False``-sized lines match anywhere and prove nothing)."""
    text = line.strip()
    if not text or text.startswith("#") or len(text) < 12:
        return None
    return text


def added_by_texts(calls: list[tuple[str, str, str]]) -> dict[str, list[str]]:
    """The significant lines of each (target, old text, new text) that the old text lacks."""
    out: dict[str, list[str]] = {}
    for rel, old, new in calls:
        old_lines = {line.strip() for line in old.splitlines()}
        for line in new.splitlines():
            t = significant(line)
            if t and t not in old_lines:
                out.setdefault(rel, []).append(t)
    return out


def check_declared(where: str, named: set[str], declared: set[str], what: str) -> None:
    """A change may only touch what fix.yaml declares, and must touch all of it."""
    for rel in sorted(named - declared):
        raise PermissionError(f"{where}: {what} {rel}, which fix.yaml does not declare as a target")
    for rel in sorted(declared - named):
        raise ChangeError(f"{where}: declares target {rel} but the change does not touch it")
