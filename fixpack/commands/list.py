"""fixpack list: the profiles, ports and the fixes of a profile in pack order."""

from __future__ import annotations

from fixpack.commands._common import emit_json, pack_of


def add_parser(sub):
    p = sub.add_parser("list", help="list profiles, ports and the fixes of a profile in pack order")
    p.add_argument("--profile")
    p.add_argument("--port", help="also list a port's source patches")
    p.add_argument("--pack")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


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
            rows += [(pack.fix(p, port=port), f"port:{port.name}") for p in port.patches]
        rows += [(pack.fix(e.id), "opt-in" if e.opt_in else "default") for e in profile.entries]
        entry = {"profile": name, "ports": pack.port_names(), "fixes": []}
        if not args.json:
            print(f"profile {name}  ({len(profile.entries)} fixes; ports: {', '.join(pack.port_names()) or 'none'})")
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
