"""Shared by manifest, lock, check and rebase-report: scratch trees and record-mode runs."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from fixpack.apply.engine import Engine
from fixpack.apply.hashing import sha256_file
from fixpack.apply.state import StateRecord, Step
from fixpack.apply.store import Store
from fixpack.cli.output import Lines
from fixpack.pack.lockfile import LOCK_FORMAT, carry_earlier, selection_key
from fixpack.pack.pack import Pack, Port, Profile
from fixpack.sources import sources


@contextmanager
def scratch(prefix: str = "fixpack-"):
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pristine_tree(profile: Profile, dest: Path) -> Path:
    return sources.materialise(profile.base["sources"], dest / "tree", profile.packages)


def tree_hashes(tree: Path, packages: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for pkg in packages:
        files = {}
        base = tree / pkg
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                p = Path(dirpath) / name
                files[p.relative_to(base).as_posix()] = sha256_file(p)
        out[pkg] = files
    return out


def selections(pack: Pack, profile: Profile) -> list[tuple[Port | None, list[str]]]:
    """Every selection the profile allows: its defaults with each subset of its opt-ins, alone
    and with each port built on it."""
    opt = profile.opt_ins
    subsets = [list(c) for r in range(len(opt) + 1) for c in itertools.combinations(opt, r)]
    ports = [None] + [pack.port(n) for n in pack.port_names() if pack.port(n).profile == profile.name]
    return [(port, subset) for port in ports for subset in subsets]


def record_selection(
    pack: Pack,
    profile: Profile,
    port: Port | None,
    opt_ins: list[str],
    tree: Path,
    quiet=True,
    memo: dict | None = None,
    located: dict | None = None,
) -> list[Step]:
    """Apply a selection to a pristine tree without pins, checking idempotence; return its steps.
    ``located`` gathers where each fix found its definitions ({fix: {sha256: {qualname: span}}})."""
    found = {p: tree / p for p in profile.packages}
    store = Store(tree / ".fixpack")
    engine = Engine(pack, profile, port, opt_ins, found, store, None, report=Lines(quiet=quiet), check_idempotent=True, memo=memo)
    engine.apply()
    if located is not None:
        for fix, texts in engine.runner.located.items():
            for digest, spans in texts.items():
                located.setdefault(fix, {}).setdefault(digest, {}).update(spans)
    state = store.read_state()
    return state.steps if isinstance(state, StateRecord) else []  # no state record: nothing was applied


def build_lock(pack: Pack, profile: Profile, manifest: dict, make_tree=None, quiet=True) -> dict:
    """Apply every selection to a fresh pristine tree (``make_tree(dest) -> tree``; default:
    the profile's release sources) and collect the pinned hashes."""
    make_tree = make_tree or (lambda dest: pristine_tree(profile, dest))
    fixes: dict[str, dict] = {}
    sels = []
    pristine: dict[str, str] = {}
    memo: dict = {}
    located: dict = {}
    for port, opt in selections(pack, profile):
        with scratch() as d:
            tree = make_tree(d)
            steps = record_selection(pack, profile, port, opt, tree, quiet=quiet, memo=memo, located=located)
        key = selection_key(port.name if port else None, opt)
        for s in steps:
            fixes[s.fix] = {"layer": str(s.layer), "hash": s.fix_hash}
            for rel in s.files:
                pkg, sub = rel.split("/", 1)
                pristine.setdefault(rel, manifest[pkg][sub])
        sels.append({"key": key, "port": port.name if port else None, "opt_in": opt, "steps": [{"fix": s.fix, "files": s.files} for s in steps]})
    data = {
        "format": LOCK_FORMAT,
        "profile": profile.name,
        "packages": profile.packages,
        "sources": profile.base.get("sources", {}),
        # which base each package's pins come from: its release, or (where the release could not
        # be fetched) its development base, which `fixpack apply` refuses to treat as the release
        "bases": sources.resolve(profile.base.get("sources", {}), profile.packages),
        "pristine": dict(sorted(pristine.items())),
        "fixes": dict(sorted(fixes.items())),
        "selections": sels,
        # where each edit and codemod found the definitions it names, per text it was run on
        # (by sha256): an apply on those bytes takes them from here instead of parsing the module
        "definitions": {
            fix: {digest: dict(sorted(spans.items())) for digest, spans in sorted(texts.items())}
            for fix, texts in sorted(located.items())
            if texts
        },
    }
    try:  # the lock this one replaces: fixes whose pins did not move keep their earlier hashes
        carry_earlier(json.loads(profile.lock_path.read_bytes()), data)
    except (OSError, ValueError):
        pass
    return data


def dump(data) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"
