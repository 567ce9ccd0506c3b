"""fixpack apply: bring the targets to the pinned state of a selection (what apply_all.py runs)."""

from __future__ import annotations

from fixpack.cli.commands._common import add_common, emit_json, make_engine, pack_of


def add_parser(sub):
    p = sub.add_parser("apply", help="apply the profile (plus opt-in fixes, plus a port) to the targets")
    add_common(p)
    p.add_argument("opt_in", nargs="*", help="opt-in fixes of the profile (applied in pack order)")
    p.add_argument("--port", help="stack a port's source patches below the profile")
    p.add_argument("--dry-run", action="store_true", help="say what would change; exit 1 when something is pending")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one fix's process may take")
    p.add_argument("--lock-wait", type=float, default=600.0, help="seconds to wait for a concurrent run")
    p.add_argument("--development-base", action="store_true",
                   help="the tree is the profile's development base, not its release (CI and development only; never on an image)")
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack.sandbox import forkserver

    if not args.dry_run:
        # The fast path said "not applied": fixes will most likely run. Their servers start now, so
        # that their imports (libcst's, for codemods) overlap the loading of the pack and the base
        # check; the engine adopts them, and they are closed here if it never does.
        forkserver.prestart(_servers(pack_of(args).root))
    try:
        engine = make_engine(args, opt_ins=args.opt_in, port=args.port, keep_applied_port=True)
        refuse_development_pins(engine, allowed=args.development_base)
        engine.timeout = args.timeout
        engine.lock_wait = args.lock_wait
        rc = engine.apply(dry_run=args.dry_run)
    finally:
        forkserver.close_early()
    if args.json:
        emit_json({"selection": engine.key, "exit": rc, "fixes": engine.report.records})
    return rc


def _servers(root) -> list[str]:
    """The fork servers a run may need: the shared one, and the own server of each kind that
    has one (the codemods') where the pack's fix folders (fixes*/ID, ports/*/fixes/ID) hold a
    fix of that kind: a stat per folder."""
    from fixpack import kinds

    def any_fix(kind: kinds.Kind) -> bool:
        patterns = (f"fixes*/*/{kind.change_file}", f"ports/*/fixes/*/{kind.change_file}")
        return any(next(iter(root.glob(p)), None) is not None for p in patterns)

    return ["", *(k.server for k in kinds.ALL.values() if k.server and any_fix(k))]


def refuse_development_pins(engine, *, allowed: bool) -> None:
    """Pins made on a development base are not pins of the release: never apply them to an image."""
    from fixpack.errors import BaseMismatch

    if engine.lock is None:
        return
    bases = engine.lock.data.get("bases") or {}
    touched = sorted({rel.split("/", 1)[0] for rel in engine.files})
    dev = [p for p in touched if (bases.get(p) or {}).get("base") == "development"]
    if not dev or allowed:
        return
    profile = engine.profile
    lines = []
    for p in dev:
        release = profile.base["sources"][p]
        used = bases[p]["spec"]
        name = release.get("repo") or release.get("distribution")
        lines.append(
            f"{p}: profile {profile.name} pins it only on its development base ({name} {used.get('branch') or used.get('version') or ''} "
            f"{str(used.get('commit') or '')[:9]}), not on the release it names ({name} {release.get('branch') or release.get('tag') or ''} "
            f"{str(release.get('commit') or release.get('version'))[:9]}): {bases[p].get('why', 'the release was not reachable')}"
        )
    repo = (profile.base["sources"][dev[0]].get("repo") or dev[0])
    raise BaseMismatch(
        "; ".join(lines)
        + f". fixpack applies no fix to bytes it has not verified; nothing was changed. Generate the pins where the {repo} repository "
        f"is reachable (or after `fixpack sources add {repo} CLONE` with a clone that holds the release): "
        f"`fixpack manifest --profile {profile.name}`, `fixpack lock --profile {profile.name}`, then `fixpack check --profile {profile.name}`"
    )
