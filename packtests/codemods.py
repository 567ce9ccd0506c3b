"""assert_codemod: a fix's codemod on a small before text gives the after text, and the after
text is a fixed point of it (LibCST's CodemodTest.assertCodemod, for fixpack's codemod kind)."""

from __future__ import annotations

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def assert_codemod(fix: str, before: str, after: str, target: str | None = None) -> None:
    from fixpack.kinds.codemod import load, transform

    classes = load(REPO / fix)
    rel = target or classes[0].TARGET
    before, after = textwrap.dedent(before), textwrap.dedent(after)
    got = transform(classes, rel, before, where=fix)
    assert got == after, f"{fix} on the before text gives:\n{got}"
    again = transform(classes, rel, after, where=fix)
    assert again == after, f"{fix} is not idempotent: on its own output it gives:\n{again}"
