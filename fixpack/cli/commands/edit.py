"""fixpack edit: prepare a tree to write a fix in, at the state the fix meets in the pack order."""

from __future__ import annotations

from pathlib import Path

from fixpack.cli.commands._common import pack_of, profile_name


def add_parser(sub):
    p = sub.add_parser("edit", help="prepare a scratch tree to write or change a fix in; then `fixpack commit ID`")
    p.add_argument("id", help="the fix (an existing one, or a new id)")
    p.add_argument("--profile")
    p.add_argument("--port", help="the fix is (or will be) a patch of this port")
    p.add_argument("--pack", type=Path, help="the fixpack repository (default: the one this fixpack runs from)")
    p.add_argument("--pristine", type=Path, help="a folder holding the release's package folders (default: the release cache)")
    p.add_argument("--replace", action="store_true", help="throw away an edit in progress and start again")
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack.proofs.authoring import prepare

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    port = pack.port(args.port) if args.port else None
    ws = prepare(pack, profile, args.id, port, args.pristine.resolve() if args.pristine else None, replace=args.replace)
    meta = ws.meta()
    state = f"with {meta['kind']} fix {args.id} applied" if meta["kind"] else "a new fix"
    print(f"{ws.tree}")
    print(f"  edit the files there ({state}; the fixes before it in the pack order: {', '.join(meta['before']) or 'none'});")
    print(f"  {ws.base} is what the fix starts from: leave it as it is.")
    print(f"  then: fixpack commit {args.id}")
    return 0
