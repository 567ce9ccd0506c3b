"""Arguments and set-up shared by the commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fixpack.errors import CheckFailed, ConfigError

# Heavier modules are imported inside the functions: `fixpack verify` and the dispatcher
# itself must stay cheap at container start.


def add_common(p: argparse.ArgumentParser, *, profile_required: bool = False) -> None:
    p.add_argument("--profile", required=profile_required, help="profile name (profiles/<name>.yaml)")
    p.add_argument("--root", type=Path, help="a folder holding the package folders (default: the installed packages)")
    p.add_argument("--pack", type=Path, help="the fixpack repository (default: the one this fixpack runs from)")
    p.add_argument("--state-dir", type=Path, help="where the state record lives (default: .fixpack beside the packages)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def pack_of(args):
    from fixpack.pack.pack import Pack, default_pack_root

    return Pack((args.pack or default_pack_root()).resolve())


def profile_name(args, pack) -> str:
    if args.profile:
        return args.profile
    names = pack.profile_names()
    if len(names) == 1:
        return names[0]
    raise ConfigError(f"--profile is required (profiles: {', '.join(names) or 'none'})")


def add_generated(p: argparse.ArgumentParser, *, what: str) -> None:
    """The arguments of a command that writes a file generated from the release sources."""
    p.add_argument("--profile")
    p.add_argument("--pack", type=Path)
    p.add_argument("--check", action="store_true", help=f"regenerate {what} and compare with the committed one; exit non-zero on any difference")


def profile_of(args):
    """(pack, profile) the arguments name."""
    pack = pack_of(args)
    return pack, pack.profile(profile_name(args, pack))


def make_engine(args, *, opt_ins=(), port: str | None = None, pinned: bool = True, quiet: bool = False, check_pack: bool = True, keep_applied_port: bool = False):
    from fixpack.apply.engine import Engine
    from fixpack.apply.store import Store
    from fixpack.apply.targets import default_state_dir, locate, refuse_if_imported, require
    from fixpack.cli.output import Lines
    from fixpack.pack.lockfile import Lock

    pack = pack_of(args)
    profile = pack.profile(profile_name(args, pack))
    port_obj = pack.port(port) if port else None
    refuse_if_imported(profile.packages)
    root = args.root.resolve() if args.root else None
    found = locate(profile.packages, root)
    require(found, profile.packages, root)
    store = Store(args.state_dir.resolve() if args.state_dir else default_state_dir(found, root))
    if port_obj is None and keep_applied_port:
        # A container start names the profile and its opt-ins; the port applied at image build stays.
        from fixpack.apply.state import StateRecord

        state = store.read_state()
        applied_port = state.port if isinstance(state, StateRecord) else None
        if isinstance(applied_port, str) and applied_port in pack.port_names():
            port_obj = pack.port(applied_port)
            if not (quiet or args.json):
                print(f"keeping port {applied_port}: applied at image build (state record {store.state_path}); `fixpack revert --all` removes it")
    lock = Lock.load(profile.lock_path) if pinned else None
    return Engine(pack, profile, port_obj, list(opt_ins), found, store, lock, report=Lines(quiet=quiet or args.json), check_pack=check_pack)


def emit_json(data) -> None:
    print(json.dumps(data, indent=1, sort_keys=True))


def write_or_check(path, text: str, *, check: bool, name: str, summary: str, regenerate: str) -> int:
    """Write a generated file, or with ``check`` compare it with the committed one (exit non-zero
    on a difference); ``regenerate`` is the command that makes it."""
    if check:
        old = path.read_text() if path.exists() else ""
        if old != text:
            raise CheckFailed(f"{path} is not what the release sources give; run `{regenerate}` and review the difference")
        print(f"{name} {path.name}: matches the release sources ({summary})")
        return 0
    path.write_text(text)
    print(f"wrote {path} ({summary})")
    return 0
