"""fixpack lock: pin every state an image can reach, produced from the pristine release sources."""

from __future__ import annotations

import json

from fixpack.commands._common import pack_of, profile_name
from fixpack.errors import CheckFailed, ConfigError


def add_parser(sub):
    p = sub.add_parser("lock", help="apply every allowed selection to the release tree and write the pinned hashes")
    p.add_argument("--profile")
    p.add_argument("--pack")
    p.add_argument("--check", action="store_true", help="regenerate and compare with the committed lock; exit non-zero on any difference")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from fixpack import release

    args.pack = Path(args.pack) if args.pack else None
    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    if not profile.manifest_path.exists():
        raise ConfigError(f"{profile.manifest_path} is missing; run `fixpack manifest --profile {profile.name}` first")
    manifest = json.loads(profile.manifest_path.read_text())["files"]
    data = release.build_lock(pack, profile, manifest, quiet=True)
    text = release.dump(data)
    summary = f"{len(data['selections'])} selections, {len(data['fixes'])} fixes, {len(data['pristine'])} files"
    if args.check:
        old = profile.lock_path.read_text() if profile.lock_path.exists() else ""
        if old != text:
            raise CheckFailed(f"{profile.lock_path} is not what the release sources give; run `fixpack lock --profile {profile.name}` and review the difference")
        print(f"lock {profile.lock_path.name}: matches ({summary})")
        return 0
    profile.lock_path.write_text(text)
    print(f"wrote {profile.lock_path} ({summary})")
    return 0
