"""The status lines every command prints: one aligned ``name....result detail`` per unit.

Standard library only and cheap to import: the engine, the journal, the runner and
`fixpack verify` (which runs at every container start) all print through it.
"""

from __future__ import annotations


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
