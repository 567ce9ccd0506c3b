"""fixpack validate: every fix, profile and port parses, their cross-references hold, and every
fix records its life on every release of its layer (fixpack/pack/lives.py)."""

from __future__ import annotations

from pathlib import Path

from fixpack.apply.locations import port_layer
from fixpack.cli.commands._common import pack_of
from fixpack.errors import ConfigError, FixpackError
from fixpack.pack.lives import gap_message, required_releases
from fixpack.pack.pack import Port


def add_parser(sub):
    p = sub.add_parser("validate", help="check the whole pack: schemas, files, references, diffs parse")
    p.add_argument("--pack")
    p.add_argument("--profile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def _check_fix_dir(d: Path, layer: str, pack_root: Path):
    """Load the fix as a whole and each release it applies on; returns the whole-fix view."""
    from fixpack.pack.pack import load_fix, release_view

    whole = load_fix(d, layer=layer)
    gate = (whole.meta.get("device_gate") or {}).get("gate")
    if gate and not (pack_root / gate.split()[0]).exists():
        raise ConfigError(f"{d / 'fix.yaml'}: device_gate.gate names {gate.split()[0]}, which does not exist")
    for release, st in whole.releases.items():
        if st["status"] in ("applies", "refreshed"):
            _check_change(release_view(whole, release))
    return whole


def _check_change(fix) -> None:
    """The release's change file parses and changes exactly the declared targets."""
    from fixpack import kinds

    kinds.kind(fix.kind).validate(fix)


def _listed(pack, release: str, port=None) -> set[str] | None:
    """The fix ids the order file of ``release`` (a profile, or a port on it) names; None when
    that release has no profile in this pack (an older or newer release: history only)."""
    if port is not None:
        return set(port.patches)
    if release not in pack.profile_names():
        return None
    return {e.id for e in pack.profile(release).entries}


def run(args) -> int:
    args.pack = Path(args.pack) if args.pack else None
    pack = pack_of(args)
    errors: list[str] = []
    checked = 0
    bases: list[tuple[Path, str, Port | None]] = [(pack.root / "fixes", "profile", None)]
    for n in pack.port_names():
        try:
            bases.append((pack.root / "ports" / n / "fixes", port_layer(n), pack.port(n)))
        except FixpackError as exc:
            errors.append(str(exc))
    for base, layer, port in bases:
        if not base.is_dir():
            continue
        for d in sorted(base.iterdir()):
            if not d.is_dir() or d.name.startswith((".", "_")):
                continue
            checked += 1
            try:
                whole = _check_fix_dir(d, layer, pack.root)
                # its life is complete: an entry for every profile of its layer (a port's fix: the port's profile)
                for release in required_releases(pack, port):
                    if release not in whole.releases:
                        raise ConfigError(gap_message(pack, d / "fix.yaml", release, port))
                # each release the fix says it applies on lists it
                for release, st in whole.releases.items():
                    on_port = port is not None and release == port.profile
                    listed = _listed(pack, release, port if on_port else None)
                    if listed is not None and st["status"] in ("applies", "refreshed") and whole.id not in listed:
                        order = port.dir / "port.yaml" if port is not None and on_port else pack.root / "profiles" / f"{release}.yaml"
                        raise ConfigError(f"{d / 'fix.yaml'}: releases.{release} is {st['status']}, but {order} does not list {whole.id}")
            except FixpackError as exc:
                errors.append(str(exc))
    profiles = [args.profile] if args.profile else pack.profile_names()
    for name in profiles:
        try:
            profile = pack.profile(name)
            pack.selection(profile, profile.opt_ins)
            for port_name in pack.port_names():
                port = pack.port(port_name)
                if port.profile == name:
                    pack.selection(profile, profile.opt_ins, port)
        except FixpackError as exc:
            errors.append(str(exc))
    for e in errors:
        print(f"error: {e}")
    print(f"validate: {checked} fix folders, {len(profiles)} profile(s), {len(pack.port_names())} port(s): {len(errors)} error(s)")
    return 2 if errors else 0
