"""The change a fix makes on its pinned release, as a unified diff, whatever the fix's kind.

Computed, never stored: the pristine target files come from the release-source cache (nothing
is fetched), the fixes before it in the lock's pack order are applied to copies of them in
process, and the fix's output is compared with the text it meets. Both sides are checked
against the lock's pins, so a diff shown as matching them is the change `fixpack apply` makes.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fixpack.errors import ConfigError, SourceUnavailable
from fixpack.kinds.diffpatch import unified


@dataclass
class FixChange:
    fix: str
    diff: str  # unified diff with a/ and b/ paths
    prior: list[str] = field(default_factory=list)  # earlier fixes that changed the same files first
    pin_problems: list[str] = field(default_factory=list)  # empty: both sides agree with the lock


def selection_for(lock, fix_id: str) -> dict:
    """The first pinned selection that applies ``fix_id`` (the lock lists the default one first)."""
    for sel in lock.data["selections"]:
        if any(s["fix"] == fix_id for s in sel["steps"]):
            return sel
    raise ConfigError(
        f"{lock.path}: no pinned selection applies {fix_id}; run `fixpack lock --profile {lock.data.get('profile')}`"
    )


def release_roots(lock, packages: set[str]) -> dict[str, Path]:
    """The cached pristine tree of each package, from the base the lock was made from.

    Raises SourceUnavailable naming every package the cache lacks."""
    from fixpack.sources import sources

    roots: dict[str, Path] = {}
    missing = []
    for package in sorted(packages):
        base = lock.data.get("bases", {}).get(package)
        if base is None:
            missing.append(f"{package} (the lock names no source for it)")
            continue
        root = sources.cached_tree(package, base["spec"])
        if root is None:
            dev = " (its development base)" if base.get("base") == "development" else ""
            missing.append(f"{package} from {sources.describe(base['spec'])}{dev}")
        else:
            roots[package] = root
    if missing:
        raise SourceUnavailable(
            f"the release-source cache ({sources.cache_dir()}) does not hold {'; '.join(missing)}; "
            f"`fixpack sources tree DIR --profile {lock.data.get('profile')}` (or scripts/setup.sh) fetches it"
        )
    return roots


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def chain_changes(pack, profile, lock, *, upto: str | None = None, key: str | None = None) -> list[FixChange]:
    """The change of each fix of one pinned selection, in pack order, each on the text the
    fixes before it leave; ``upto``: stop at that fix and return only its change;
    ``key``: the selection (default: the first that applies ``upto``, else the first)."""
    from fixpack.proofs import proof

    if key is not None:
        sel = next((s for s in lock.data["selections"] if s["key"] == key), None)
        if sel is None:
            raise ConfigError(f"{lock.path}: selection {key!r} is not pinned")
    elif upto is not None:
        sel = selection_for(lock, upto)
    else:
        sel = lock.data["selections"][0]
    steps = sel["steps"]
    if upto is not None:
        ids = [s["fix"] for s in steps]
        if upto not in ids:
            raise ConfigError(f"{lock.path}: selection {sel['key']!r} does not apply {upto}")
        steps = steps[: ids.index(upto) + 1]
        # only the earlier fixes that reach its files, directly or through a file they share
        needed = set(steps[-1]["files"])
        keep = [steps[-1]]
        for step in reversed(steps[:-1]):
            if needed & set(step["files"]):
                needed |= set(step["files"])
                keep.append(step)
        steps = keep[::-1]
    port = pack.port(sel["port"]) if sel.get("port") else None
    fixes = {f.id: f for f in pack.selection(profile, sel.get("opt_in") or [], port)}
    rels = sorted({rel for s in steps for rel in s["files"]})
    roots = release_roots(lock, {rel.split("/", 1)[0] for rel in rels})
    out: list[FixChange] = []
    touched: dict[str, list[str]] = {}  # file -> fixes that changed it so far
    with tempfile.TemporaryDirectory(prefix="fixpack-show-") as tmp:
        tree = Path(tmp)
        for rel in rels:
            src = roots[rel.split("/", 1)[0]] / rel
            if src.is_file():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, tree / rel)  # a copy: the cache's files are never written
        for step in steps:
            fix = fixes.get(step["fix"])
            if fix is None:
                raise ConfigError(
                    f"{lock.path}: selection {sel['key']!r} pins {step['fix']}, which the pack no longer selects; run `fixpack lock`"
                )
            before = {rel: (tree / rel).read_bytes() if (tree / rel).is_file() else None for rel in fix.target_rels}
            new, _ = proof.apply_change(fix, tree)
            after = {rel: new.get(rel, before[rel]) for rel in before}
            problems = []
            want_hash = lock.data.get("fixes", {}).get(fix.id, {}).get("hash")
            if want_hash is not None and want_hash != fix.content_hash():
                problems.append(
                    f"{fix.id} changed since {lock.path.name} was generated; run `fixpack lock --profile {profile.name}`"
                )
            for rel, pins in step["files"].items():
                want_before, want_after = pins
                if _sha(before.get(rel)) != want_before:
                    problems.append(
                        f"{rel}: the text it meets is not the pinned one (an earlier fix or the cache differs)"
                    )
                elif _sha(after.get(rel)) != want_after:
                    problems.append(f"{rel}: its output is not the pinned one")
            if upto is None or fix.id == upto:
                prior = sorted({f for rel in before for f in touched.get(rel, [])}, key=[s["fix"] for s in steps].index)
                diff = "".join(
                    unified(b, after[rel] or b"", rel)
                    for rel, b in sorted(before.items())
                    if b != after[rel] and b is not None
                )
                out.append(FixChange(fix.id, diff, prior, problems))
            for rel, data in new.items():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                (tree / rel).write_bytes(data)
                touched.setdefault(rel, []).append(fix.id)
    return out
