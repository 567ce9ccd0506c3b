"""fixpack sources: seed, list and materialise the release sources in the cache."""

from __future__ import annotations

from pathlib import Path

from fixpack.cli.commands._common import pack_of, profile_name
from fixpack.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser("sources", help="release sources: add a local clone or wheel to the cache, list, materialise a tree")
    s = p.add_subparsers(dest="action", required=True)
    a = s.add_parser("add", help="seed the cache: `add vllm-gaudi CLONE` or `add vllm-wheel FILE.whl`")
    a.add_argument("name")
    a.add_argument("path", type=Path)
    m = s.add_parser("tree", help="materialise a profile's pristine release tree into DEST")
    m.add_argument("dest", type=Path)
    m.add_argument("--profile")
    m.add_argument("--pack", type=Path)
    ls = s.add_parser("list", help="what the cache holds")
    for q in (a, ls):
        q.add_argument("--pack", type=Path)
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack.sources import sources

    if args.action == "add":
        if args.name.endswith("-wheel"):
            dest = sources.add_wheel(args.path)
        else:
            dest = sources.add_clone(args.name, args.path)
        print(f"cached {args.name}: {dest}")
        return 0
    if args.action == "list":
        root = sources.cache_dir()
        print(f"cache: {root}")
        for sub in ("wheels", "git", "trees"):
            d = root / sub
            for p in sorted(d.iterdir()) if d.is_dir() else []:
                if p.name.startswith("."):
                    continue
                done = "" if sub != "trees" or (p / sources.COMPLETE).exists() else "  (incomplete)"
                print(f"  {sub}/{p.name}{done}")
        return 0
    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    if args.dest.exists() and any(args.dest.iterdir()):
        raise ConfigError(f"{args.dest} is not empty")
    sources.materialise(profile.base["sources"], args.dest)
    print(f"{profile.name} release tree: {args.dest}")
    return 0
