"""fixpack refresh: re-make diffs that still apply, but at an offset, against the state the
fixes before them in pack order leave (like `quilt refresh`). Edits and codemods need no refresh."""

from __future__ import annotations

import os
from pathlib import Path

from fixpack.cli.commands._common import pack_of, profile_name
from fixpack.errors import FixFailed


def add_parser(sub):
    p = sub.add_parser("refresh", help="re-make offset diffs against the fixes before them (maintainers)")
    p.add_argument("--profile")
    p.add_argument("--pack", type=Path)
    p.add_argument("--port", help="refresh along the port's chain (its patches, then the profile)")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack import kinds
    from fixpack.apply.store import atomic_write
    from fixpack.kinds.diffpatch import parse_diff, rebase_file_patch, unified
    from fixpack.sources import release

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    port = pack.port(args.port) if args.port else None
    fixes = pack.selection(profile, profile.opt_ins, port)
    changed = 0
    with release.scratch("fixpack-refresh-") as work:
        tree = release.pristine_tree(profile, work)
        for fix in fixes:
            kind = kinds.kind(fix.kind)
            if not kind.refreshable:  # located by definition, not by line: nothing to refresh
                sources = {t.rel: (tree / t.rel).read_bytes() for t in fix.targets}
                for rel, data in kind.apply(fix.change_dir, sources).outputs.items():
                    atomic_write(tree / rel, data, like=os.stat(tree / rel))
                print(f"{fix.id:<36} {fix.kind}")
                continue
            parts, status_all = [], []
            for fp in parse_diff(fix.change_file.read_bytes(), where=str(fix.change_file)):
                p = tree / fp.path
                old = p.read_bytes()
                status, new, notes = rebase_file_patch(old, fp)
                status_all.append(status)
                if new is None:
                    raise FixFailed(f"{fix.id}: {fp.path}: {status}: {'; '.join(notes)}")
                parts.append(unified(old, new, fp.path))
                atomic_write(p, new, like=os.stat(p))
            if "offset" in status_all:
                changed += 1
                if not args.dry_run:
                    fix.change_file.write_text("".join(parts))
                print(f"{fix.id:<36} refreshed (was at an offset)")
            else:
                print(f"{fix.id:<36} exact")
    print(f"{changed} diff(s) {'would be ' if args.dry_run else ''}refreshed; run `fixpack lock` next")
    return 0
