"""Proofs reused only when every input is unchanged.

A proof (a fix's red/green, parts and requirements in `fixpack check`; vllm-gaudi's unit tests
on a pristine tree in hpu_harness.unit_tests) is a function of what it read. Its key is a set of
named digests, one per kind of input; the ledger keeps each item's last good proof with the
key it was made under, and a later run reuses it only when every digest is identical. A miss
names the inputs that changed. What the key covers, and what it cannot see, is stated where
each key is made (fixpack/proofs/check.py, hpu_harness/unit_tests.py) and in docs/ci.md.

The building blocks here:
  file / tree digests      bytes and relative paths, sorted;
  import closure           the repository modules a set of Python files imports, followed
                           through every ``import``/``from`` statement anywhere in a file
                           (function bodies too), resolved against the import roots; a module
                           found in no root is a third-party or release module and is covered
                           by the venv / release digests instead; files beside an imported
                           module in its folder that are not Python (data a module reads) are in;
  environment              the running interpreter's distributions and versions, Python's
                           version and build, the CPU's model and feature flags (tests choose
                           paths by them).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SKIP_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of(value: object) -> str:
    """A digest of a JSON-able value (keys sorted)."""
    return _sha(json.dumps(value, sort_keys=True, default=str).encode())


def files_digest(files: Iterable[Path], base: Path | None = None) -> str:
    """Paths (relative to ``base`` when given) and bytes of ``files``, in sorted order."""
    h = hashlib.sha256()
    for path in sorted({Path(f) for f in files}):
        name = str(path.relative_to(base)) if base else str(path)
        h.update(name.encode() + b"\0")
        h.update(_sha(path.read_bytes()).encode() + b"\n")
    return h.hexdigest()


def tree_files(root: Path) -> list[Path]:
    """Every regular file under ``root`` but caches (byte code, pytest's, hypothesis')."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            p = Path(dirpath) / name
            if not name.endswith(SKIP_SUFFIXES) and p.is_file() and not p.is_symlink():
                out.append(p)
    return sorted(out)


def tree_digest(root: Path) -> str:
    return files_digest(tree_files(root), root)


# ---------------------------------------------------------------- the import graph


def _module_file(name: str, roots: list[Path]) -> list[Path]:
    """The files that importing ``name`` runs from the first root that has it: each package's
    ``__init__.py`` on the way and the module itself; [] when no root has it."""
    parts = name.split(".")
    for root in roots:
        found: list[Path] = []
        here = root
        for i, part in enumerate(parts):
            pkg, mod = here / part, here / f"{part}.py"
            last = i == len(parts) - 1
            if (pkg / "__init__.py").is_file():
                found.append(pkg / "__init__.py")
                here = pkg
            elif last and mod.is_file():
                found.append(mod)
            elif pkg.is_dir() and not last:
                here = pkg  # a namespace package
            else:
                found = []
                break
        if found:
            return found
    return []


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import statement of ``path``, relative ones
    made absolute from the file's place (a package's ``__init__.py`` is the package)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except SyntaxError:
        return []  # a file that does not parse imports nothing here; its bytes are still in the key
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names if a.name != "*"]
            if node.level:
                out.append((f"\0{node.level}\0{node.module or ''}", names))
            elif node.module:
                out.append((node.module, names))
    return out


def _package_of(path: Path, roots: list[Path]) -> str | None:
    for root in roots:
        try:
            rel = path.resolve().relative_to(root.resolve())
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        else:
            parts.pop()  # the module's own name: its package is what it sits in
        return ".".join(parts)
    return None


def import_closure(files: Iterable[Path], roots: list[Path]) -> list[Path]:
    """``files`` and every file of the repository they import, transitively, with the data
    files beside each imported module (see the module docstring)."""
    seen: set[Path] = set()
    todo = [Path(f).resolve() for f in files]
    data_dirs: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for module, names in _imports(path):
            if module.startswith("\0"):
                _, level, rest = module.split("\0")
                pkg = _package_of(path, roots)
                if pkg is None:
                    continue
                base = pkg.split(".") if pkg else []
                up = int(level) - 1
                base = base[: len(base) - up] if up else base
                module = ".".join([*base, rest] if rest else base)
                if not module:
                    continue
            for candidate in [module] + [f"{module}.{n}" for n in names]:
                for f in _module_file(candidate, roots):
                    f = f.resolve()
                    if f not in seen:
                        todo.append(f)
                    data_dirs.add(f.parent)
    data = [
        p
        for d in data_dirs
        for p in d.iterdir()
        if p.is_file() and p.suffix != ".py" and not p.name.endswith(SKIP_SUFFIXES)
    ]
    return sorted(seen | set(data))


def closure_digest(files: Iterable[Path], roots: list[Path], base: Path) -> str:
    closure = import_closure(files, roots)
    return files_digest(closure, base) if all(_inside(p, base) for p in closure) else files_digest(closure)


def _inside(path: Path, base: Path) -> bool:
    try:
        path.relative_to(base)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- the environment


def distributions_digest() -> str:
    """The running interpreter's installed distributions, ``name==version`` sorted (an editable
    install counts by name and version: its code is in the import closure)."""
    from importlib.metadata import distributions

    names = sorted({f"{(d.metadata['Name'] or '?').lower()}=={d.version}" for d in distributions()})
    return digest_of(names)


def python_digest() -> str:
    return digest_of([sys.version, sys.implementation.name, platform.machine()])


def cpu_digest() -> str:
    """The CPU's model and feature flags: tests pick kernels by them (AMX, AVX-512 BF16)."""
    model, flags = platform.processor() or "?", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":", 1)[0].strip()
            if key == "model name" and model in ("?", "", platform.machine()):
                model = line.split(":", 1)[1].strip()
            elif key == "flags" and not flags:
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return digest_of([model, flags])


def environment_parts() -> dict[str, str]:
    return {"venv": distributions_digest(), "python": python_digest(), "cpu": cpu_digest()}


# ---------------------------------------------------------------- keys and the ledger


@dataclass(frozen=True)
class Key:
    """Named digests of a proof's inputs."""

    parts: dict[str, str]

    @property
    def digest(self) -> str:
        return digest_of(self.parts)

    @property
    def short(self) -> str:
        return self.digest[:12]

    def changed(self, earlier: dict[str, str]) -> list[str]:
        """The names of the inputs whose digest differs from ``earlier``'s (added or gone too)."""
        return sorted(k for k in set(self.parts) | set(earlier) if self.parts.get(k) != earlier.get(k))


def ledger_dir() -> Path:
    """FIXPACK_PROOF_CACHE, else the fixpack cache's proofs/ (beside the release sources)."""
    env = os.environ.get("FIXPACK_PROOF_CACHE")
    if env:
        return Path(env)
    from fixpack.sources.sources import cache_dir

    return cache_dir() / "proofs"


class Ledger:
    """One JSON file per item: the last good proof of it and the key it was made under."""

    def __init__(self, scope: str, root: Path | None = None):
        self.dir = (root or ledger_dir()) / _safe(scope)

    def _path(self, item: str) -> Path:
        return self.dir / f"{_safe(item)}.json"

    def lookup(self, item: str, key: Key) -> tuple[dict | None, str]:
        """(the stored record, when its key is ``key``; else None), and a phrase saying why."""
        path = self._path(item)
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None, "no earlier proof"
        except (OSError, ValueError) as exc:
            return None, f"earlier proof unreadable ({exc.__class__.__name__})"
        if not isinstance(entry, dict) or not isinstance(entry.get("parts"), dict):
            return None, "earlier proof malformed"
        if entry.get("key") == key.digest and entry["parts"] == key.parts:
            return entry, f"unchanged since {entry.get('proven_at', '?')}, key {key.short}"
        changed = key.changed(entry["parts"])
        return None, f"changed since {entry.get('proven_at', '?')}: {', '.join(changed) or 'key format'}"

    def store(self, item: str, key: Key, record: Mapping[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        entry = {
            "key": key.digest,
            "parts": key.parts,
            "proven_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "record": record,
        }
        tmp = self._path(item).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entry, indent=1, sort_keys=True))
        os.replace(tmp, self._path(item))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in name) or "_"
