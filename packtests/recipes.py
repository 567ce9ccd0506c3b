"""Recipe test helpers (tests/unit/test_recipe.py, ports/*/tests/test_recipe_*.py, the launch-line
tests): the serving pages beside the checkout, a recipe rendered, a recipe edited as data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from packtests.builders import REPO

COOKBOOK_IN_IMAGE = "/opt/gaudi-cookbook/"  # the pages: "$COOKBOOK is /opt/gaudi-cookbook there"


def seed_page(number: str) -> Path | None:
    """The serving page ``shared/seeds/<number>_*.txt`` in a folder above the checkout, or None
    (the pages are not part of the repository)."""
    for up in REPO.parents:
        found = sorted((up / "shared" / "seeds").glob(f"{number}_*.txt"))
        if found:
            return found[0]
    return None


def rendered(recipe: Path) -> str:
    """What `fixpack recipe show --recipe RECIPE` prints."""
    from fixpack.pack.recipe import load_recipe, render

    return render(load_recipe(recipe))


def as_in_image(block: str) -> str:
    """A rendered block as the pages write it: an export of a repository path names the image's
    copy (``"$COOKBOOK/x"`` is ``/opt/gaudi-cookbook/x`` there, unquoted)."""
    lines = []
    for line in block.splitlines(keepends=True):
        if line.startswith("export ") and '="$COOKBOOK/' in line:
            line = line.replace('"$COOKBOOK/', COOKBOOK_IN_IMAGE, 1).replace('"\n', "\n")
        lines.append(line)
    return "".join(lines)


def edited(recipe: Path, change: Callable[[dict], object]) -> dict:
    """The recipe's data after ``change`` (which edits it in place); the file is not written."""
    data = yaml.safe_load(recipe.read_text())
    change(data)
    return data


def write_recipe(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
