"""Path safety: everything a fix names must stay inside its package folder."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from fixpack.errors import ConfigError, EnvironmentFault


def check_relpath(rel: str, *, where: str) -> PurePosixPath:
    """A package-relative POSIX path with no way out: no absolute, no '..', no NUL, no backslash."""
    if not isinstance(rel, str) or not rel:
        raise ConfigError(f"{where}: empty path")
    if "\x00" in rel or "\\" in rel or any(ord(c) < 32 for c in rel):
        raise ConfigError(f"{where}: path {rel!r} has a NUL, control character or backslash")
    p = PurePosixPath(rel)
    if p.is_absolute() or rel.startswith("~"):
        raise ConfigError(f"{where}: path {rel!r} is absolute; paths are relative to the package folder")
    if any(part in ("..", ".", "") for part in rel.split("/")):
        raise ConfigError(f"{where}: path {rel!r} contains '..', '.' or an empty part")
    return p


def resolve_inside(package_dir: Path, rel: str, *, where: str) -> Path:
    """Join and make sure no symlink on the way leads out of the package folder."""
    check_relpath(rel, where=where)
    base = package_dir.resolve()
    full = package_dir / rel
    try:
        real = full.resolve(strict=False)
    except OSError as exc:  # symlink loops
        raise EnvironmentFault(f"{where}: cannot resolve {full}: {exc}") from exc
    if not real.is_relative_to(base):
        raise EnvironmentFault(f"{where}: {rel} resolves to {real}, outside the package folder {base} (symlink?); nothing was changed")
    return full


def is_regular_file(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    import stat

    return stat.S_ISREG(st.st_mode)
