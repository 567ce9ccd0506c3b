"""fixpack lock: pin every state an image can reach, produced from the pristine release sources."""

from __future__ import annotations

import json

from fixpack.cli.commands._common import add_generated, profile_of, write_or_check
from fixpack.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser("lock", help="apply every allowed selection to the release tree and write the pinned hashes")
    add_generated(p, what="the lock")
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack.sources import release

    pack, profile = profile_of(args)
    if not profile.manifest_path.exists():
        raise ConfigError(f"{profile.manifest_path} is missing; run `fixpack manifest --profile {profile.name}` first")
    manifest = json.loads(profile.manifest_path.read_text())["files"]
    data = release.build_lock(pack, profile, manifest, quiet=True)
    text = release.dump(data)
    summary = f"{len(data['selections'])} selections, {len(data['fixes'])} fixes, {len(data['pristine'])} files"
    return write_or_check(profile.lock_path, text, check=args.check, name="lock", summary=summary, regenerate=f"fixpack lock --profile {profile.name}")
