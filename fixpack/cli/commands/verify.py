"""fixpack verify: what the image holds, from the state record and the files."""

from __future__ import annotations

import glob
import json
import os

from fixpack.cli.commands._common import add_common, emit_json
from fixpack.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser("verify", help="report each fix applied or drifted and each file untouched, fixed or drifted")
    add_common(p)
    p.set_defaults(run=run)


def _located(lock, root) -> dict[str, str]:
    """The lock's packages under --root; without it, all of them where Python finds them or
    none (one missing names them all in the not-found message, as before locate was shared)."""
    from fixpack.apply.locations import locate

    packages = locate(lock.data["packages"], root)
    return packages if root is not None or len(packages) == len(lock.data["packages"]) else {}


def _applied_profile(lock, root, state_dir) -> str | None:
    from pathlib import Path

    from fixpack.apply.locations import state_dir as state_folder

    if lock is None:
        return None
    packages = _located(lock, root)
    found = [Path(v) for v in packages.values()]
    if not found:
        return None
    d = Path(state_folder(found, root, state_dir.resolve() if state_dir else None))
    try:
        name = json.loads((d / "state.json").read_text()).get("profile")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name.replace(".", "").replace("-", "").replace("_", "").isalnum() else None


def run(args) -> int:
    from pathlib import Path

    from fixpack.apply.locations import lock_path as lock_of
    from fixpack.apply.locations import state_dir as state_folder
    from fixpack.apply.store import Store
    from fixpack.apply.verify import verify
    from fixpack.cli.output import Lines
    from fixpack.pack.lockfile import Lock

    pack = (args.pack or Path(__file__).resolve().parents[3]).resolve()
    root = args.root.resolve() if args.root else None
    if args.profile:
        lock_path = Path(lock_of(pack, args.profile))
    else:
        locks = sorted(glob.glob(str(pack / "profiles" / "*.lock.json")))
        if len(locks) == 1:
            lock_path = Path(locks[0])
        else:
            # several profiles: the one the image's state record names
            applied = _applied_profile(Lock.load(Path(locks[0])) if locks else None, root, args.state_dir)
            if applied is None:
                raise ConfigError(f"--profile is required: this image has no state record naming one (locks: {', '.join(os.path.basename(p) for p in locks) or 'none'})")
            lock_path = Path(lock_of(pack, applied))
    lock = Lock.load(lock_path)
    found = {k: Path(v) for k, v in _located(lock, root).items()}
    missing = [p for p in lock.data["packages"] if p not in found]
    if missing:
        from fixpack.errors import BaseMismatch

        raise BaseMismatch(f"package(s) {', '.join(missing)} not found {'under ' + str(root) if root else 'in this environment'}")
    state_dir = Path(state_folder(found.values(), root, args.state_dir.resolve() if args.state_dir else None))
    report = Lines(quiet=args.json)
    rc, result = verify(found, Store(state_dir), lock, report)
    if args.json:
        emit_json(dict(result, exit=rc))
    elif rc == 0:
        print("verify: no drift")
    return rc
