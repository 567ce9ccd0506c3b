"""What every kind returns, and its error."""

from __future__ import annotations

from dataclasses import dataclass, field

from fixpack.errors import FixFailed


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


def check_declared(where: str, named: set[str], declared: set[str], what: str) -> None:
    """A change may only touch what fix.yaml declares, and must touch all of it."""
    for rel in sorted(named - declared):
        raise PermissionError(f"{where}: {what} {rel}, which fix.yaml does not declare as a target")
    for rel in sorted(declared - named):
        raise ChangeError(f"{where}: declares target {rel} but the change does not touch it")
