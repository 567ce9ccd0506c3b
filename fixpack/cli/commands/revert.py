"""fixpack revert: give back the exact pristine bytes of one fix's files, or of all."""

from __future__ import annotations

from fixpack.cli.commands._common import add_common, make_engine
from fixpack.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser("revert", help="undo one applied fix, or --all")
    add_common(p)
    p.add_argument("fix", nargs="?", help="the fix to undo")
    p.add_argument("--all", action="store_true", help="undo every applied fix")
    p.set_defaults(run=run)


def run(args) -> int:
    from fixpack.apply import engine as eng
    from fixpack.apply.state import StateRecord

    if bool(args.fix) == bool(args.all):
        raise ConfigError("name one fix to revert, or pass --all")
    # The engine is built for the selection recorded in the state, so its paths and pins match.
    probe = make_engine(args, pinned=False, quiet=True)
    state = probe.store.read_state()
    opt_in = (state.opt_in or []) if isinstance(state, StateRecord) else []
    port = state.port if isinstance(state, StateRecord) else None
    engine = make_engine(args, opt_ins=opt_in, port=port, pinned=probe.profile.lock_path.exists(), check_pack=False)
    return eng.revert(engine, None if args.all else args.fix)
