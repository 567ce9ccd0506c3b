"""fixpack check: prove every fix against the pristine release sources (fixpack/proofs/check.py)."""

from __future__ import annotations

import os
from pathlib import Path

from fixpack.cli.commands._common import emit_json, pack_of, profile_name
from fixpack.errors import CheckFailed


def add_parser(sub):
    p = sub.add_parser("check", help="red/green proof of every fix against the pristine release sources")
    p.add_argument("--profile")
    p.add_argument("--pack", type=Path)
    p.add_argument("--port", help="check a port's patches (stacked on its profile) instead of the profile")
    p.add_argument(
        "--only", nargs="*", default=None, help="check only these fixes (the chain before them is still applied)"
    )
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="test runs in parallel")
    p.add_argument("--test-timeout", type=float, default=900.0)
    p.add_argument("--no-parts", action="store_true", help="skip the proof that every hunk / edit is needed")
    p.add_argument("--no-requires", action="store_true", help="skip the proof that the declared requires are complete")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="prove every fix now (by default a fix whose proof key is unchanged reuses its last good proof)",
    )
    p.add_argument("--brief", action="store_true", help="one line per fix (no per-test and per-part lines)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack.proofs.check import check_release

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    port = pack.port(args.port) if args.port else None
    report = check_release(
        pack,
        profile,
        port,
        only=args.only,
        workers=args.jobs,
        test_timeout=args.test_timeout,
        parts=not args.no_parts,
        requires=not args.no_requires,
        quiet=args.json,
        brief=args.brief,
        fresh=args.fresh,
    )
    counts, totals, machine = report.counts, report.totals, report.machine
    if args.json:
        emit_json(
            {
                "profile": report.profile,
                "port": report.port,
                "results": report.results,
                "totals": totals,
                "skipped_sources": report.skipped_sources,
                "seconds": report.seconds,
                "phase_seconds": report.phase_seconds,
                "machine": machine,
            }
        )
    else:
        summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        n_reused = sum(1 for r in report.results if "proof" in r and r["proof"]["reused"])
        if n_reused:
            summary += f" ({n_reused} reused unchanged, {totals['fixes'] - n_reused} proven now)"
        print(
            f"\ncheck {report.profile}{' port ' + report.port if report.port else ''}: {summary} in {report.seconds:.0f}s"
        )
        print(
            f"  tests {totals['tests']} ({totals['red_green']} red then green, {totals['guards']} regression guards); "
            f"parts shown needed {totals['parts_needed']}/{totals['parts']} (+{totals['parts_comment_only']} comment-only); "
            f"requirement sets verified {totals['requires_verified']}/{totals['fixes']}"
        )
        print(
            "  seconds: "
            + ", ".join(f"{k} {v}" for k, v in report.phase_seconds.items())
            + f" (jobs {args.jobs}; {machine['cpu']}, {machine['cpus']} CPUs, load average {machine['load_start']} at the start, {machine['load_end']} at the end)"
        )
        for pkg, why in report.skipped_sources.items():
            print(f"!!! {pkg} fixes were NOT checked: {why}")
    if counts.get("FAILED"):
        raise CheckFailed(f"{counts['FAILED']} fix(es) not proven")
    return 0
