"""sha256 of files and of fix folders.

Standard library only, no pathlib: the container-start check (fixpack.apply.fastpath) hashes
through it before anything else is imported.
"""

from __future__ import annotations

import hashlib
import os


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fix_hash(fix_dir: str | os.PathLike, change_file: str | os.PathLike) -> str:
    """A fix's content hash on one release: its fix.yaml and that release's change file, each
    by name and bytes. The state record records it and the lock pins it."""
    h = hashlib.sha256()
    for path in (os.path.join(fix_dir, "fix.yaml"), change_file):
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def short(h: str | None) -> str:
    return (h or "-")[:12]
