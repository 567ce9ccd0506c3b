"""The three kinds of change a fix can make, one module each, behind one interface.

- ``diff`` (patch.diff): a unified diff, applied hunk by hunk at exact lines.
- ``edit`` (edits.yaml): data, not code: in a named definition, replace a text exactly once.
  Located with ``ast``, applied as text.
- ``codemod`` (codemod.py): a LibCST transformer written with matchers, for changes whose
  place is a structure (an argument, a call, an assignment, a guard at the top of a function)
  rather than a text. Only this kind imports libcst, and only in the process of such a fix.

A :class:`Kind` here holds what the driver and the container-start path read of a kind
(its change file, whether it is idempotent, refreshable, which fork server runs it); its
operations are the functions of its module ``fixpack.kinds.<name>``, written down as
:class:`fixpack.kinds.base.KindModule` and imported on first use. ``apply(fix_dir, sources,
drop=None, known=None) -> Applied``: ``sources`` maps each declared target (``package/path``)
to its bytes; ``drop`` leaves one part out (for ``fixpack check``'s every-part-necessary
proof); ``known`` is what the lock recorded of where the fix's definitions sit in the texts
it was pinned on (``Applied.located``), keyed by their sha256, so that an edit or a codemod
need not parse a pinned module again to find them. This package imports nothing: the
container-start path reads ``CHANGE_FILES`` from it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself is not imported: the container-start path imports this package
if TYPE_CHECKING:
    from pathlib import Path

    from fixpack.kinds.base import Applied, KindModule, Rebased


class Kind:
    """One kind of change: its data, and its module's operations on a fix of this kind."""

    def __init__(self, name: str, change_file: str, *, idempotent: bool, refreshable: bool, server: str = ""):
        self.name = name
        self.change_file = change_file
        # running it on its own output changes nothing (the engine re-runs it to check)
        self.idempotent = idempotent
        # the change is text at exact lines, made from a tree's files: `fixpack commit` writes
        # it from the edited tree, `fixpack refresh` and the rebase report re-make it where the
        # lines moved, and `fixpack show` prints it as the change on the pinned release
        self.refreshable = refreshable
        # the fork server whose process has imported what the kind needs ("": the shared one)
        self.server = server

    def __repr__(self) -> str:
        return f"Kind({self.name!r})"

    def module(self) -> KindModule:
        """The module that implements the kind (imported on first use)."""
        import importlib
        from typing import cast

        return cast("KindModule", importlib.import_module(f"fixpack.kinds.{self.name}"))

    def apply(
        self, fix_dir: Path, sources: dict[str, bytes], drop: int | None = None, known: dict | None = None
    ) -> Applied:
        return self.module().apply(fix_dir, sources, drop, known)

    def rebase(self, fix, tree: Path) -> Rebased:
        """The fix on another release's ``tree``: (class, new file contents, notes, refreshed change)."""
        return self.module().rebase(fix, tree)

    def added_lines(self, fix, tree: Path) -> dict[str, list[str]]:
        """The significant lines the fix adds, by target."""
        return self.module().added_lines(fix, tree)

    def validate(self, fix) -> None:
        """The fix's change file parses and changes exactly the declared targets (ConfigError if not)."""
        self.module().validate(fix)


# a diff applied twice fails; the engine knows its result by its pin
DIFF = Kind("diff", "patch.diff", idempotent=False, refreshable=True)
EDIT = Kind("edit", "edits.yaml", idempotent=True, refreshable=False)
CODEMOD = Kind("codemod", "codemod.py", idempotent=True, refreshable=False, server="codemod")
ALL = {k.name: k for k in (DIFF, EDIT, CODEMOD)}
KINDS = tuple(ALL)
CHANGE_FILES = {k.name: k.change_file for k in ALL.values()}


def kind(name: str) -> Kind:
    """The kind named ``name`` (a fix.yaml's ``kind``)."""
    try:
        return ALL[name]
    except KeyError:
        raise ValueError(f"unknown fix kind {name!r} (known: {', '.join(KINDS)})") from None


def module(name: str) -> KindModule:
    """The module that implements the kind ``name`` (imported on first use)."""
    return kind(name).module()
