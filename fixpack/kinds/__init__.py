"""The three kinds of change a fix can make, one module each, behind one interface.

- ``diff`` (patch.diff): a unified diff, applied hunk by hunk at exact lines.
- ``edit`` (edits.yaml): data, not code: in a named definition, replace a text exactly once.
  Located with ``ast``, applied as text.
- ``codemod`` (codemod.py): a LibCST transformer written with matchers, for changes whose
  place is a structure (an argument, a call, an assignment, a guard at the top of a function)
  rather than a text. Only this kind imports libcst, and only in the process of such a fix.

Each kind module has ``CHANGE_FILE``, ``IDEMPOTENT`` (running it on its own output changes
nothing) and ``apply(fix_dir, sources, drop=None, known=None) -> Applied``. ``sources`` maps
each declared target (``package/path``) to its bytes; ``drop`` leaves one part out (for
``fixpack check``'s every-part-necessary proof); ``known`` is what the lock recorded of where
the fix's definitions sit in the texts it was pinned on (``Applied.located``), keyed by their
sha256, so that an edit or a codemod need not parse a pinned module again to find them. This package imports nothing: the container-start path reads
``CHANGE_FILES`` from it.
"""

from __future__ import annotations

KINDS = ("diff", "edit", "codemod")
CHANGE_FILES = {"diff": "patch.diff", "edit": "edits.yaml", "codemod": "codemod.py"}


def module(kind: str):
    """The module that implements ``kind`` (imported on first use)."""
    import importlib

    if kind not in KINDS:
        raise ValueError(f"unknown fix kind {kind!r} (known: {', '.join(KINDS)})")
    return importlib.import_module(f"fixpack.kinds.{kind}")
