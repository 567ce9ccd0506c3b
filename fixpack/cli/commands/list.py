"""fixpack list: the profiles, ports and the fixes of a profile in pack order, every fix's life on
each profile (fixpack/pack/lives.py), and docs/packs.md's status tables made from them."""

from __future__ import annotations

from pathlib import Path

from fixpack.apply.locations import port_layer
from fixpack.cli.commands._common import emit_json, pack_of
from fixpack.errors import CheckFailed, ConfigError


def add_parser(sub):
    p = sub.add_parser(
        "list", help="list profiles, ports, the fixes of a profile in pack order and every fix's life on it"
    )
    p.add_argument("--profile")
    p.add_argument("--port", help="also list a port's source patches")
    p.add_argument("--pack")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--write-docs",
        metavar="PATH",
        help="rewrite the status tables of PATH (docs/packs.md) from fix.yaml, one per profile, between their markers",
    )
    p.add_argument("--check", action="store_true", help="with --write-docs: compare, write nothing, exit non-zero on a difference")
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
        return "no entry (fixpack validate refuses this)"
    said = entry.get("why") or entry.get("upstream") or entry.get("evidence") or ""
    first = " ".join(str(said).split())
    text = f"{entry['status']}: {first}" if first and entry["status"] != "applies" else entry["status"]
    return text if len(text) <= width else text[: width - 3] + "..."


def write_docs(pack, path: Path, check: bool) -> int:
    """docs/packs.md's status tables from fix.yaml; with ``check``, CheckFailed on a difference."""
    from fixpack.pack import lives

    doc = lives.doc_name(pack, path)
    text, changed = lives.render_docs(pack, path, doc)
    tables = f"{len(pack.profile_names())} status table(s)"
    if check:
        if changed:
            raise CheckFailed(
                f"{path}: the status table(s) of {', '.join(changed)} are not what fix.yaml gives; run "
                f"`fixpack list --write-docs {doc}` and review the difference"
            )
        print(f"{path}: {tables} match fix.yaml")
        return 0
    if changed:
        path.write_text(text)
    print(f"{path}: {tables}, {len(changed)} rewritten{' (' + ', '.join(changed) + ')' if changed else ''}")
    return 0


def run(args) -> int:
    from fixpack.pack.lives import lives

    args.pack = Path(args.pack) if args.pack else None
    pack = pack_of(args)
    if args.check and not args.write_docs:
        raise ConfigError("--check compares the status tables --write-docs PATH names; give it PATH")
    if args.write_docs:
        return write_docs(pack, Path(args.write_docs), args.check)
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
        entry = {"profile": name, "ports": pack.port_names(), "bases": bases, "fixes": [], "not_applied": [], "lives": []}
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
        listed = {f.id for f, _ in rows}
        every = lives(pack, name)
        for life in every:
            st = life.entry or {}
            entry["lives"].append({"id": life.fix.id, "role": life.role, "status": life.status, "why": st.get("why"), "upstream": st.get("upstream"), "evidence": st.get("evidence")})
            if life.entry is not None and not life.applied and not life.role.startswith("port"):
                entry["not_applied"].append({"id": life.fix.id, "status": st["status"], "why": st.get("why"), "upstream": st.get("upstream"), "evidence": st.get("evidence")})
        rest = [life for life in every if life.fix.id not in listed or life.entry is None]
        if rest and not args.json:
            print(f"  the life on {name} of every other fix of its layers (fix.yaml releases.{name}):")
            for life in rest:
                print(f"     {life.fix.id:<34} {life.role:<17} {status_text(life.entry)}")
        out.append(entry)
    if args.json:
        emit_json(out)
    return 0
