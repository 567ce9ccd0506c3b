"""fixpack show ID: a fix's description and its change."""

from __future__ import annotations

from pathlib import Path

from fixpack.commands._common import emit_json, pack_of
from fixpack.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser("show", help="show one fix: what, why, change, targets, tests")
    p.add_argument("fix")
    p.add_argument("--port", help="look among a port's patches")
    p.add_argument("--pack")
    p.add_argument("--profile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    args.pack = Path(args.pack) if args.pack else None
    pack = pack_of(args)
    port = pack.port(args.port) if args.port else None
    profile = pack.profile(args.profile) if args.profile else None
    entry = next((e for e in profile.entries if e.id == args.fix), None) if profile else None
    if profile is not None and entry is None and port is None:
        raise ConfigError(f"{args.fix!r} is not a fix of profile {profile.name} (its fixes: {', '.join(e.id for e in profile.entries)})")
    try:
        fix = pack.fix(args.fix, port=port, rel_dir=pack.entry_dir(profile, entry) if entry else None)
    except ConfigError:
        known = sorted(p.name for p in (pack.root / "fixes").iterdir() if (p / "fix.yaml").exists())
        raise ConfigError(f"unknown fix {args.fix!r}; known: {', '.join(known)}") from None
    if args.json:
        emit_json(dict(fix.meta, folder=str(fix.dir), change=fix.change_file.read_text()))
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
        from fixpack.commands.list import base_lines

        bases = base_lines(profile)
        for package in sorted({t.package for t in fix.targets}):
            if package in bases:
                print(f"  base ({profile.name}) {package}: {bases[package]['text']}")
    print("  tests:   " + ", ".join(m["tests"]))
    print(f"\n--- {fix.change_file.name}\n{fix.change_file.read_text()}")
    return 0
