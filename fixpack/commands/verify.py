"""fixpack verify: what the image holds, from the state record and the files."""

from __future__ import annotations

from fixpack import engine as eng
from fixpack.commands._common import add_common, emit_json, pack_of, profile_name
from fixpack.lockfile import Lock
from fixpack.store import Store
from fixpack.targets import default_state_dir, locate, require


def add_parser(sub):
    p = sub.add_parser("verify", help="report each fix applied or drifted and each file untouched, fixed or drifted")
    add_common(p)
    p.set_defaults(run=run)


def run(args) -> int:
    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    root = args.root.resolve() if args.root else None
    found = locate(profile.packages, root)
    require(found, profile.packages, root)
    store = Store(args.state_dir.resolve() if args.state_dir else default_state_dir(found, root))
    lock = Lock.load(profile.lock_path) if profile.lock_path.exists() else None
    report = eng.Reporter(quiet=args.json)
    rc, result = eng.verify(found, store, lock, report)
    if args.json:
        emit_json(dict(result, exit=rc))
    elif rc == 0:
        print("verify: no drift")
    return rc
