"""fixpack rebase-report: what happens to each fix on another release.

Each fix, in pack order (defaults and every opt-in), is tried on the other release's
pristine tree, stacked on the fixes before it that still apply. Classes:
  exact     applies exactly
  offset    applies at an offset: needs a refresh (the refreshed diff is shown)
  conflict  some hunks no longer match (named)
  upstream  already upstream: the new release has the fixed state (or, with --run-tests,
            the fix's test passes without it): retire it
  moved     a target file moved or was removed
  nomatch   a codemod's anchors match nothing
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from fixpack.commands._common import emit_json, pack_of, profile_name
from fixpack.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser("rebase-report", help="classify every fix against another vllm-gaudi commit and/or vLLM version")
    p.add_argument("--profile")
    p.add_argument("--pack", type=Path)
    p.add_argument("--onto", action="append", default=[], metavar="PACKAGE=REF", help="e.g. vllm_gaudi=<commit or tag>, vllm=0.27.0")
    p.add_argument("--run-tests", action="store_true", help="also run each fix's test on the new release without the fix")
    p.add_argument("--show-diffs", action="store_true", help="print refreshed diffs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run, command_name="rebase-report")


def new_sources(profile, onto: list[str]) -> dict:
    from fixpack import sources

    srcs = copy.deepcopy(profile.base["sources"])
    if not onto:
        raise ConfigError("give at least one --onto PACKAGE=REF")
    for item in onto:
        if "=" not in item:
            raise ConfigError(f"--onto {item!r}: expected PACKAGE=REF")
        pkg, ref = item.split("=", 1)
        if pkg not in srcs:
            raise ConfigError(f"--onto {item!r}: {pkg} is not a source of the profile ({', '.join(srcs)})")
        spec = srcs[pkg]
        if spec["kind"] == "wheel":
            spec["version"] = ref
            spec.pop("commit", None)
        else:
            spec["commit"] = sources.rev_parse(spec["repo"], ref) if len(ref) != 40 else ref
            spec["tag"] = ref
    return srcs


def classify(fix, tree: Path, found: dict) -> tuple[str, dict[str, bytes], list[str], str]:
    """(class, new file contents, notes, refreshed diff)."""
    changes: dict[str, bytes] = {}
    notes: list[str] = []
    for t in fix.targets:
        if not (tree / t.rel).is_file():
            return "moved", {}, [f"{t.rel} is not in the new release"], ""
    if fix.kind == "diff":
        from fixpack.diffpatch import parse_diff, rebase_file_patch, unified

        classes = []
        refreshed = []
        for fp in parse_diff(fix.change_file.read_bytes(), where=str(fix.change_file)):
            data = (tree / fp.path).read_bytes()
            status, new, n = rebase_file_patch(data, fp)
            classes.append(status)
            notes += [f"{fp.path}: {x}" for x in n]
            if new is not None:
                changes[fp.path] = new
                if status == "offset":
                    refreshed.append(unified(data, new, fp.path))
        for cls in ("conflict", "upstream", "offset"):
            if cls in classes:
                if cls == "upstream" and len(set(classes)) > 1:
                    return "conflict", {}, notes, ""
                return cls, (changes if cls == "offset" else {}), notes, "".join(refreshed)
        return "exact", changes, notes, ""
    from fixpack.codemod import RewriteError, apply_rewrites, load_rewrites

    rewrites = load_rewrites(fix.change_file)
    same = True
    for t in fix.targets:
        data = (tree / t.rel).read_bytes()
        try:
            new = apply_rewrites(rewrites, t.rel, data.decode()).text.encode()
        except RewriteError as exc:
            msg = str(exc)
            return ("nomatch" if "found 0" in msg else "conflict"), {}, [msg], ""
        changes[t.rel] = new
        same &= new == data
    return ("upstream" if same else "exact"), ({} if same else changes), (["the codemod changes nothing: the fixed code is already there"] if same else []), ""


def run(args) -> int:
    from fixpack import release, sources
    from fixpack.commands.check import run_tests
    from fixpack.store import atomic_write

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    srcs = new_sources(profile, args.onto)
    fixes = pack.selection(profile, profile.opt_ins)
    rows = []
    with release.scratch("fixpack-rebase-") as work:
        tree = sources.materialise(srcs, work / "tree")
        found = {p: tree / p for p in profile.packages}
        for fix in fixes:
            if args.run_tests and fix.cpu_demonstrable:
                rc, summary = run_tests(fix, tree, 900)
            else:
                rc, summary = None, ""
            cls, changes, notes, refreshed = classify(fix, tree, found)
            if rc == 0 and cls not in ("moved",):
                notes.append(f"its test passes on the new release without the fix ({summary})")
                cls = "upstream"
            for rel, data in changes.items():
                atomic_write(tree / rel, data, like=os.stat(tree / rel))  # the next fixes stack on it
            rows.append({"fix": fix.id, "class": cls, "notes": notes, "refreshed_diff": refreshed})
    if args.json:
        emit_json({"profile": profile.name, "onto": srcs, "fixes": rows})
        return 0
    print(f"rebase report: profile {profile.name} onto " + ", ".join(f"{k}={v.get('tag') or v.get('version')}" for k, v in srcs.items() if k in dict(x.split('=', 1) for x in args.onto)))
    labels = {"exact": "applies exactly", "offset": "applies at an offset (refresh)", "conflict": "CONFLICTS", "upstream": "already upstream: retire", "moved": "target moved/removed", "nomatch": "codemod matches nothing"}
    for r in rows:
        print(f"  {r['fix']:<34} {labels[r['class']]}")
        for n in r["notes"][:4]:
            print(f"      {n}")
        if args.show_diffs and r["refreshed_diff"]:
            print("      refreshed diff:\n" + "\n".join("        " + l for l in r["refreshed_diff"].splitlines()))
    counts = {}
    for r in rows:
        counts[r["class"]] = counts.get(r["class"], 0) + 1
    print("summary: " + ", ".join(f"{v} {labels[k]}" for k, v in counts.items()))
    return 0
