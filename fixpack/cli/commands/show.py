"""fixpack show ID: a fix's description, and the unified diff it makes on the pinned release
(computed from the release-source cache by fixpack/proofs/changes.py, whatever the fix's kind)."""

from __future__ import annotations

from pathlib import Path

from fixpack import kinds
from fixpack.cli.commands._common import emit_json, pack_of
from fixpack.errors import ConfigError, FixpackError


def add_parser(sub):
    p = sub.add_parser("show", help="show one fix: what, why, targets, tests, and the diff it makes on the pinned release")
    p.add_argument("fix")
    p.add_argument("--port", help="look among a port's patches")
    p.add_argument("--pack")
    p.add_argument("--profile", help="the profile whose pinned release the diff is made on (default: the first that has the fix)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    args.pack = Path(args.pack) if args.pack else None
    pack = pack_of(args)
    port = pack.port(args.port) if args.port else None
    if args.profile:
        profile = pack.profile(args.profile)
    elif port is not None:
        profile = pack.profile(port.profile)
    else:
        profile = next((pf for pf in map(pack.profile, pack.profile_names()) if any(e.id == args.fix for e in pf.entries)), None)
    entry = next((e for e in profile.entries if e.id == args.fix), None) if profile else None
    if not pack.fix_dir(args.fix, port).is_dir():
        known = sorted(p.name for p in (pack.root / "fixes").iterdir() if (p / "fix.yaml").exists())
        raise ConfigError(f"unknown fix {args.fix!r}; known: {', '.join(known)}")
    if profile is not None and entry is None and port is None and args.profile and args.profile not in pack.fix(args.fix).releases:
        raise ConfigError(f"{args.fix!r} is not a fix of profile {profile.name} (its fixes: {', '.join(e.id for e in profile.entries)})")
    if port is None and entry is None:
        profile = None  # a fix no profile applies now (retired everywhere): its description and releases
    fix = pack.fix(args.fix, port=port, release=profile.name if profile else None)
    change, unavailable = _change(pack, profile, fix)
    if args.json:
        shown = {"profile": profile.name if profile else None, "diff": change.diff if change else None, "unavailable": unavailable}
        if change is not None:
            shown.update(after=change.prior, pin_problems=change.pin_problems)
        change_text = fix.change_file.read_text() if fix.change_file.is_file() else None
        emit_json(dict(fix.meta, folder=str(fix.dir), change_file=str(fix.change_file), change=change_text, release_diff=shown))
        return 0
    m = fix.meta
    print(f"{fix.id}  ({fix.kind}, {'CPU-demonstrable' if fix.cpu_demonstrable else 'device gate: ' + m['device_gate']['gate']})")
    print(f"  {m['summary']}")
    for key in ("why", "evidence", "change", "upstream", "remove_when"):
        if m.get(key):
            text = str(m[key]).strip().replace("\n", "\n    ")
            print(f"\n  {key}:\n    {text}")
    print("\n  targets: " + ", ".join(fix.target_rels))
    if profile is not None:
        from fixpack.cli.commands.list import base_lines

        bases = base_lines(profile)
        for package in sorted({t.package for t in fix.targets}):
            if package in bases:
                print(f"  base ({profile.name}) {package}: {bases[package]['text']}")
    print("  tests:   " + ", ".join(m["tests"]))
    print("\n  releases (fix.yaml):")
    for rel, st in fix.releases.items():
        mark = "*" if profile is not None and rel == profile.name else " "
        own = f"  change: {rel}/{fix.change_file.name}" if st["status"] == "refreshed" else ""
        print(f"  {mark} {rel:<10} {st['status']}{own}")
        for key in ("why", "upstream", "evidence"):
            if st.get(key) and (key != "evidence" or st["status"] == "upstream"):
                text = str(st[key]).strip().replace("\n", "\n               ")
                print(f"               {key}: {text}")
    if change is not None and profile is not None:
        after = f", after {', '.join(change.prior)} (earlier in pack order, same files)" if change.prior else ""
        print(f"\n  the change on profile {profile.name}'s pinned release{after}:\n")
        print(change.diff, end="" if change.diff.endswith("\n") else "\n")
        if change.pin_problems:
            for problem in change.pin_problems:
                print(f"!!! not the pinned change: {problem}")
        else:
            print("  (the text it meets and its output are the lock's pinned bytes)")
    else:
        print(f"\n!!! the diff on the pinned release is not shown: {unavailable}")
    if not fix.change_file.is_file():
        pass  # no release applies a shared change, and no profile was named
    elif not kinds.kind(fix.kind).refreshable or change is None:  # else the change above is the diff
        print(f"\n--- {fix.change_file.relative_to(fix.dir)}\n{fix.change_file.read_text()}")
    else:
        print(f"\n  written as {fix.change_file.relative_to(fix.dir)} in {fix.dir}")
    return 0


def _change(pack, profile, fix):
    """(the fix's change on its pinned release, None) or (None, why it cannot be shown)."""
    if profile is None:
        return None, f"{fix.id} is in no profile, so it has no pinned release"
    from fixpack.pack.lockfile import Lock
    from fixpack.proofs.changes import chain_changes

    try:
        lock = Lock.load(profile.lock_path)
        (change,) = chain_changes(pack, profile, lock, upto=fix.id)
    except FixpackError as exc:
        return None, str(exc)
    return change, None
