"""fixpack rebase-report: classify every fix against another release (fixpack/rebase.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fixpack.commands._common import emit_json, pack_of, profile_name


def add_parser(sub):
    p = sub.add_parser("rebase-report", help="classify every fix against another vllm-gaudi commit and/or vLLM version")
    p.add_argument("--profile")
    p.add_argument("--pack", type=Path)
    p.add_argument(
        "--onto",
        action="append",
        default=[],
        metavar="PACKAGE=REF",
        help="e.g. vllm_gaudi=<commit or tag>, vllm=0.27.0",
    )
    p.add_argument(
        "--no-tests", action="store_true", help="text only: do not run each fix's tests on the new release without it"
    )
    p.add_argument("--run-tests", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    p.add_argument(
        "--only", nargs="*", default=None, help="report only these fixes (the ones before them are still stacked)"
    )
    p.add_argument("--test-timeout", type=float, default=900.0)
    p.add_argument("--show-diffs", action="store_true", help="print refreshed diffs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run, command_name="rebase-report")


def run(args) -> int:
    from fixpack.rebase import LABELS, new_sources, rebase_report

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    srcs = new_sources(profile, args.onto)
    rows = rebase_report(pack, profile, srcs, only=args.only, tests=not args.no_tests, test_timeout=args.test_timeout)
    if args.json:
        emit_json({"profile": profile.name, "onto": srcs, "fixes": rows})
        return 0
    named = dict(x.split("=", 1) for x in args.onto)
    onto = ", ".join(f"{k}={v.get('tag') or v.get('version')}" for k, v in srcs.items() if k in named)
    print(f"rebase report: profile {profile.name} onto {onto}")
    for r in rows:
        t = f"  [tests without it: {r['tests']}]" if r["tests"] else ""
        print(f"  {r['fix']:<34} {LABELS[r['class']]}{t}")
        for n in r["notes"][:5]:
            print(f"      {n[:200]}")
        if args.show_diffs and r["refreshed_diff"]:
            print("      refreshed diff:\n" + "\n".join("        " + line for line in r["refreshed_diff"].splitlines()))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["class"]] = counts.get(r["class"], 0) + 1
    print("summary: " + ", ".join(f"{v} {LABELS[k]}" for k, v in counts.items()))
    return 0
