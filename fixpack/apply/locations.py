"""Where a selection's state folder and lock are, and what a layer names.

One rule for the engine, `fixpack verify` and the container-start check (fixpack.apply.fastpath),
which imports this module before anything else: os.path only, no pathlib, no dataclasses.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

STATE_FOLDER = ".fixpack"
PORT_LAYER = "port:"  # a port's patches are layer "port:<name>"; the profile's fixes are "profile"


def state_dir(
    package_dirs: Iterable[str | os.PathLike],
    root: str | os.PathLike | None = None,
    given: str | os.PathLike | None = None,
) -> str:
    """The state record's folder: ``given`` (--state-dir), else in --root, else beside the
    package folders (in the first folder, by name, that holds one of them)."""
    if given is not None:
        return os.fspath(given)
    if root is not None:
        return os.path.join(os.fspath(root), STATE_FOLDER)
    parents = sorted({os.path.dirname(os.fspath(p)) for p in package_dirs})
    return os.path.join(parents[0], STATE_FOLDER)


def lock_path(pack_root: str | os.PathLike, profile: str) -> str:
    """A profile's lock: profiles/<profile>.lock.json in the pack."""
    return os.path.join(os.fspath(pack_root), "profiles", f"{profile}.lock.json")


def locate(packages: Iterable[str], root: str | os.PathLike | None) -> dict[str, str]:
    """Each package's folder: under ``root`` if given, else where Python finds it (find_spec
    of a top-level name finds it without importing it). A package not found is left out."""
    found: dict[str, str] = {}
    for name in packages:
        if root is not None:
            d = os.path.join(os.fspath(root), name)
            if os.path.isdir(d):
                found[name] = d
            continue
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            found[name] = list(spec.submodule_search_locations)[0]
    return found


def layer_port(layer: str) -> str | None:
    """The port a layer string names, or None for the profile's own layer."""
    return layer[len(PORT_LAYER) :] if layer.startswith(PORT_LAYER) else None


def port_layer(port: str | None) -> str:
    """The layer string of a port's patches (``None``: the profile's fixes)."""
    return f"{PORT_LAYER}{port}" if port else "profile"
