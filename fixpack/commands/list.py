"""fixpack list: the profiles, ports and the fixes of a profile in pack order."""

from __future__ import annotations

from fixpack.commands._common import emit_json, pack_of
from fixpack.locations import port_layer


def add_parser(sub):
    p = sub.add_parser("list", help="list profiles, ports and the fixes of a profile in pack order")
    p.add_argument("--profile")
    p.add_argument("--port", help="also list a port's source patches")
    p.add_argument("--pack")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def describe_source(spec: dict) -> str:
    if spec.get("kind") == "wheel":
        return f"{spec.get('distribution')} {spec.get('version')} (wheel" + (f", commit {spec['commit']}" if spec.get("commit") else "") + ")"
    ref = spec.get("tag") or spec.get("branch")
    return f"{spec.get('repo')} {ref + ' ' if ref else ''}{str(spec.get('commit', ''))[:9]} (git)"


def base_lines(profile) -> dict[str, dict]:
    """Each package's release, and where a development base stands in for it, which pins the lock holds."""
    import json

    try:
        locked = json.loads(profile.lock_path.read_text()).get("bases", {})
    except (OSError, ValueError):
        locked = {}
    out = {}
    for package, spec in profile.base.get("sources", {}).items():
        text = describe_source(spec)
        dev = spec.get("development")
        pinned = (locked.get(package) or {}).get("base")
        if dev:
            companion = ", ".join(f"{p} {describe_source(s)}" for p, s in (dev.get("imports_with") or {}).items())
            text += f"; development base {describe_source(dev)}" + (f" with {companion}" if companion else "")
        if pinned:
            text += f"; the lock pins it on its {pinned}" + (" base: an image of the release is refused until `fixpack lock` is run where the release can be fetched" if pinned == "development" else "")
        out[package] = {"text": text, "release": spec.get("commit") or spec.get("version"), "development": bool(dev), "pinned_on": pinned}
    return out


def run(args) -> int:
    from pathlib import Path

    args.pack = Path(args.pack) if args.pack else None
    pack = pack_of(args)
    names = [args.profile] if args.profile else pack.profile_names()
    out = []
    for name in names:
        profile = pack.profile(name)
        rows = []
        if args.port:
            port = pack.port(args.port)
            rows += [(pack.fix(p, port=port), port_layer(port.name)) for p in port.patches]
        rows += [(pack.fix(e.id, rel_dir=pack.entry_dir(profile, e)), "opt-in" if e.opt_in else "default") for e in profile.entries]
        bases = base_lines(profile)
        entry = {"profile": name, "ports": pack.port_names(), "bases": bases, "fixes": []}
        if not args.json:
            print(f"profile {name}  ({len(profile.entries)} fixes; ports: {', '.join(pack.port_names()) or 'none'})")
            for package, b in bases.items():
                print(f"  base {package}: {b['text']}")
        for i, (fix, role) in enumerate(rows, 1):
            cpu = "" if fix.cpu_demonstrable else "  [device gate]"
            targets = ", ".join(fix.target_rels)
            entry["fixes"].append({"order": i, "id": fix.id, "role": role, "kind": fix.kind, "targets": fix.target_rels, "cpu_demonstrable": fix.cpu_demonstrable, "summary": fix.meta["summary"]})
            if not args.json:
                print(f"{i:3d}. {fix.id:<34} {role:<8} {fix.kind:<7} {targets}{cpu}")
        out.append(entry)
    if args.json:
        emit_json(out)
    return 0
