"""Find the target package folders without importing them."""

from __future__ import annotations

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
    from fixpack.apply import locations

    return {name: Path(d) for name, d in locations.locate(packages, root).items()}


def require(found: dict[str, Path], needed: list[str], root: Path | None) -> None:
    missing = [p for p in needed if p not in found]
    if missing:
        where = f"under --root {root}" if root else "in this Python environment"
        raise BaseMismatch(f"package(s) {', '.join(missing)} not found {where}; is this a vllm-gaudi image? (or pass --root DIR)")


def default_state_dir(found: dict[str, Path], root: Path | None) -> Path:
    """The state record lives beside the targets: in --root, or in the folder holding the packages."""
    from fixpack.apply.locations import state_dir

    return Path(state_dir(found.values(), root))


def _read(path: Path, limit: int = 65536) -> str | None:
    """A hint file of an installed package (its version file, metadata, a checkout's HEAD), in
    folders its owner may shape: never through a symlink at its name, never from a FIFO or a
    device, and None when it is over ``limit`` bytes (fixpack.apply.dirfd.read_path)."""
    from fixpack.apply import dirfd

    try:
        return dirfd.read_path(str(path), limit=limit).decode("utf-8", "replace")
    except (OSError, dirfd.NotRegular):
        return None


def _git_head(start: Path) -> str | None:
    """HEAD of a checkout holding ``start`` (editable installs), read without git."""
    for d in [start, *start.parents][:4]:
        head = _read(d / ".git" / "HEAD")
        if head is None:
            continue
        head = head.strip()
        if head.startswith("ref: "):
            ref = head[5:]
            value = _read(d / ".git" / ref)
            if value:
                return value.strip()
            packed = _read(d / ".git" / "packed-refs", 1 << 22) or ""
            for line in packed.splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0]
            return None
        return head
    return None


def identify(found: dict[str, Path]) -> dict[str, dict]:
    """Version and commit strings present in the image: hints only; the base is decided by content."""
    import json
    import re

    out: dict[str, dict] = {}
    for name, folder in found.items():
        info: dict = {}
        text = _read(folder / "_version.py")
        if text:
            for key in ("version", "commit_id"):
                # `__version__ = version = '0.26.0'` (vcs-versioning) or `version = "..."`
                m = re.search(rf"^(?:__{key}__|{key})\s*=\s*(?:\w+\s*=\s*)?['\"]([^'\"]+)['\"]", text, re.M)
                if m:
                    info[key] = m.group(1)
        dist = name.replace("_", "-")
        for d in sorted(folder.parent.glob(f"{name}-*.dist-info")) + sorted(folder.parent.glob(f"{dist}-*.dist-info")):
            info["dist_info"] = d.name
            raw = _read(d / "direct_url.json")
            if raw:
                try:
                    du = json.loads(raw)
                    info["direct_url"] = du.get("url")
                    commit = (du.get("vcs_info") or {}).get("commit_id")
                    if commit:
                        info["direct_url_commit"] = commit
                except ValueError:
                    pass
            break
        head = _git_head(folder.parent)
        if head:
            info["git_head"] = head
        out[name] = info
    return out
