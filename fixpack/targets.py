"""Find the target package folders without importing them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from fixpack.errors import BaseMismatch, ConfigError


def refuse_if_imported(packages: list[str]) -> None:
    """A process that already imported a target would keep running the old code."""
    loaded = [p for p in packages if p in sys.modules]
    if loaded:
        raise ConfigError(
            f"{', '.join(loaded)} already imported in this process; fixpack must run in its own process "
            "before vLLM starts (e.g. `python apply_all.py ...` ahead of `vllm serve`)"
        )


def locate(packages: list[str], root: Path | None) -> dict[str, Path]:
    """Map each package name to its folder: under ``root`` if given, else where Python finds it."""
    found: dict[str, Path] = {}
    for name in packages:
        if root is not None:
            d = root / name
            if d.is_dir():
                found[name] = d
            continue
        try:
            spec = importlib.util.find_spec(name)  # top-level: finds, does not execute
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            found[name] = Path(list(spec.submodule_search_locations)[0])
    return found


def require(found: dict[str, Path], needed: list[str], root: Path | None) -> None:
    missing = [p for p in needed if p not in found]
    if missing:
        where = f"under --root {root}" if root else "in this Python environment"
        raise BaseMismatch(f"package(s) {', '.join(missing)} not found {where}; is this a vllm-gaudi image? (or pass --root DIR)")


def default_state_dir(found: dict[str, Path], root: Path | None) -> Path:
    """The state record lives beside the targets: in --root, or in the folder holding the packages."""
    if root is not None:
        return root / ".fixpack"
    parents = sorted({p.parent for p in found.values()})
    return parents[0] / ".fixpack"
