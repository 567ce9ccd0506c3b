"""fixpack list: the profiles, ports and the fixes of a profile in pack order."""

from __future__ import annotations

from fixpack.apply.locations import port_layer
from fixpack.cli.commands._common import emit_json, pack_of


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


def status_text(entry: dict | None, width: int = 110) -> str:
    """One line for a fix's status on one release: ``refreshed: what moved``."""
    if entry is None:
        return "not evaluated"
    said = entry.get("why") or entry.get("upstream") or entry.get("evidence") or ""
    first = " ".join(str(said).split())
    text = f"{entry['status']}: {first}" if first and entry["status"] != "applies" else entry["status"]
    return text if len(text) <= width else text[: width - 3] + "..."


def not_applied(pack, release: str) -> list:
    """The pack's fixes whose fix.yaml records ``release`` as upstream or dropped."""
    from fixpack.pack.pack import load_fix

    out = []
    d = pack.root / "fixes"
    for sub in sorted(d.iterdir()) if d.is_dir() else []:
        if not (sub / "fix.yaml").is_file():
            continue
        fix = load_fix(sub)
        entry = fix.releases.get(release)
        if entry is not None and entry["status"] not in ("applies", "refreshed"):
            out.append((fix, entry))
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
        rows += [(pack.fix(e.id, release=name), "opt-in" if e.opt_in else "default") for e in profile.entries]
        bases = base_lines(profile)
        entry = {"profile": name, "ports": pack.port_names(), "bases": bases, "fixes": [], "not_applied": []}
        if not args.json:
            print(f"profile {name}  ({len(profile.entries)} fixes; ports: {', '.join(pack.port_names()) or 'none'})")
            for package, b in bases.items():
                print(f"  base {package}: {b['text']}")
        for i, (fix, role) in enumerate(rows, 1):
            cpu = "" if fix.cpu_demonstrable else "  [device gate]"
            targets = ", ".join(fix.target_rels)
            status = fix.status or {}
            entry["fixes"].append({"order": i, "id": fix.id, "role": role, "kind": fix.kind, "targets": fix.target_rels, "cpu_demonstrable": fix.cpu_demonstrable, "summary": fix.meta["summary"], "status": status.get("status"), "status_why": status.get("why")})
            if not args.json:
                print(f"{i:3d}. {fix.id:<34} {role:<8} {fix.kind:<7} {status.get('status', '-'):<9} {targets}{cpu}")
                if status.get("status") == "refreshed":
                    print(f"{'':6}{status_text(status)}")
        gone = not_applied(pack, name)
        for fix, st in gone:
            entry["not_applied"].append({"id": fix.id, "status": st["status"], "why": st.get("why"), "upstream": st.get("upstream"), "evidence": st.get("evidence")})
        if gone and not args.json:
            print(f"  not applied on {name} (fix.yaml releases.{name}):")
            for fix, st in gone:
                print(f"     {fix.id:<34} {status_text(st)}")
        out.append(entry)
    if args.json:
        emit_json(out)
    return 0
