"""The status lines every command prints: one aligned ``name....result detail`` per unit.

Standard library only and cheap to import: the engine, the journal, the runner and
`fixpack verify` (which runs at every container start) all print through it.
"""

from __future__ import annotations

# C0 controls but tab, DEL, C1 controls, and the format characters that reorder or hide text
# (bidirectional overrides and isolates, zero-width marks, line and paragraph separators): a
# terminal acts on them, so text from a fix could clear the screen, move the cursor over an
# earlier line, forge a status line, set the clipboard (OSC 52) or show other text than it holds.
_HIDDEN = {0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0xFEFF}
_HIDDEN.update(range(0x202A, 0x202F))
_HIDDEN.update(range(0x2066, 0x206A))
_ESCAPES = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in [*range(0x20), *range(0x7F, 0xA0), *_HIDDEN] if c != 0x09
}
_ESCAPES_KEEP_NL = {c: e for c, e in _ESCAPES.items() if c != 0x0A}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` from a fix (its error, its output, a name it chose) made safe to print: every
    control or hiding character written as an escape (``\\x1b``, ``\\u202e``), so that nothing
    it holds acts on the terminal. With ``lines``, newlines are kept and each line is indented
    with ``| ``, so that no line of it can pass for one of fixpack's own (``fix-x....applied``);
    without, a newline is escaped too (the text stays on the line it is part of). Every place
    that prints text a fix provided goes through here."""
    if lines:
        return "\n".join(f"  | {line}" for line in text.translate(_ESCAPES_KEEP_NL).split("\n"))
    return text.translate(_ESCAPES)


class Lines:
    """Aligned status lines, kept as records too (``records``) for ``--json``."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.records: list[dict] = []

    def line(self, name: str, result: str, detail: str = "", **record) -> None:
        self.records.append(dict(name=name, result=result, detail=detail, **record))
        if not self.quiet:
            print(f"{name}{'.' * max(3, 44 - len(name))}{result:<10} {detail}".rstrip(), flush=True)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)
