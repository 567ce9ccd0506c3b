"""fixpack rebase-report: classify every fix against another release (fixpack/proofs/rebase.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fixpack.cli.commands._common import emit_json, pack_of, profile_name


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
    p.add_argument(
        "--release",
        metavar="NAME",
        help="the new release's name (its profile to be): write each fix's entry for it into its fix.yaml `releases:` "
        "(applies / refreshed with its own <fix>/NAME/ change / upstream with the evidence); conflicts are listed, not written",
    )
    p.add_argument("--dry-run", action="store_true", help="with --release: print the entries instead of writing them")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run, command_name="rebase-report")


def run(args) -> int:
    from fixpack.proofs.rebase import LABELS, new_sources, rebase_report

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    srcs = new_sources(profile, args.onto)
    rows = rebase_report(pack, profile, srcs, only=args.only, tests=not args.no_tests, test_timeout=args.test_timeout)
    written = (
        _write_entries(pack, profile, rows, args.release, dry_run=args.dry_run, quiet=args.json) if args.release else []
    )
    if args.json:
        emit_json({"profile": profile.name, "onto": srcs, "fixes": rows, "release": args.release, "written": written})
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
    if not args.release:
        print("(name the new release with --release NAME to write these entries into each fix.yaml `releases:`)")
    return 0


def _write_entries(pack, profile, rows: list[dict], release: str, *, dry_run: bool, quiet: bool) -> list[dict]:
    """Each row's entry for ``release`` written into its fix.yaml (or, dry run, printed)."""
    from fixpack.proofs.rebase import _entry_text, release_entry, write_release_entry

    fixes = {f.id: f for f in pack.selection(profile, profile.opt_ins)}
    out = []
    for r in rows:
        fix = fixes[r["fix"]]
        entry, change, decided = release_entry(fix, r, release)
        rec = {"fix": fix.id, "entry": entry, "decided": decided, "files": []}
        if entry is not None and release in fix.meta["releases"]:
            rec["decided"] = f"left as it is: releases already has an entry {release!r}"
        elif entry is not None and not dry_run:
            rec["files"] = [str(p) for p in write_release_entry(fix, release, entry, change)]
        out.append(rec)
        if quiet:
            continue
        if entry is None or rec["decided"].startswith("left"):
            print(f"  {fix.id:<34} {rec['decided']}")
        elif dry_run:
            own = f"  (+ {release}/{fix.change_file.name}, {len(change)} bytes)" if change is not None else ""
            print(f"  {fix.id:<34} would add to fix.yaml{own}:\n" + _entry_text(release, entry).rstrip())
        else:
            print(f"  {fix.id:<34} wrote {', '.join(rec['files'])}: {rec['decided']}")
    return out
