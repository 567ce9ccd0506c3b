"""fixpack apply: bring the targets to the pinned state of a selection (what apply_all.py runs)."""

from __future__ import annotations

from fixpack.commands._common import add_common, emit_json, make_engine


def add_parser(sub):
    p = sub.add_parser("apply", help="apply the profile (plus opt-in fixes, plus a port) to the targets")
    add_common(p)
    p.add_argument("opt_in", nargs="*", help="opt-in fixes of the profile (applied in pack order)")
    p.add_argument("--port", help="stack a port's source patches below the profile")
    p.add_argument("--dry-run", action="store_true", help="say what would change; exit 1 when something is pending")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one fix's process may take")
    p.add_argument("--lock-wait", type=float, default=600.0, help="seconds to wait for a concurrent run")
    p.set_defaults(run=run)


def run(args) -> int:
    engine = make_engine(args, opt_ins=args.opt_in, port=args.port, keep_applied_port=True)
    engine.timeout = args.timeout
    engine.lock_wait = args.lock_wait
    rc = engine.apply(dry_run=args.dry_run)
    if args.json:
        emit_json({"selection": engine.key, "exit": rc, "fixes": engine.report.records})
    return rc
