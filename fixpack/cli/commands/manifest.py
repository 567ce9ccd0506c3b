"""fixpack manifest: per-file sha256 of a profile's pristine release trees, stored with the profile."""

from __future__ import annotations

from fixpack.cli.commands._common import add_generated, profile_of, write_or_check


def add_parser(sub):
    p = sub.add_parser("manifest", help="write profiles/<profile>.manifest.json from the release sources")
    add_generated(p, what="the manifest")
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack.sources import release, sources

    _, profile = profile_of(args)
    with release.scratch() as d:
        tree = release.pristine_tree(profile, d)
        hashes = release.tree_hashes(tree, profile.packages)
    bases = sources.resolve(profile.base["sources"], profile.packages)
    text = release.dump({"profile": profile.name, "sources": profile.base["sources"], "bases": bases, "files": hashes})
    counts = ", ".join(f"{p} {len(v)} files" for p, v in hashes.items())
    return write_or_check(profile.manifest_path, text, check=args.check, name="manifest", summary=counts, regenerate=f"fixpack manifest --profile {profile.name}")
