"""fixpack validate: every fix, profile and port parses, and their cross-references hold."""

from __future__ import annotations

from pathlib import Path

from fixpack.commands._common import pack_of
from fixpack.errors import ConfigError, FixpackError
from fixpack.locations import port_layer


def add_parser(sub):
    p = sub.add_parser("validate", help="check the whole pack: schemas, files, references, diffs parse")
    p.add_argument("--pack")
    p.add_argument("--profile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def _check_fix_dir(d: Path, layer: str, pack_root: Path) -> None:
    from fixpack.pack import load_fix

    fix = load_fix(d, layer=layer)
    gate = (fix.meta.get("device_gate") or {}).get("gate")
    if gate and not (pack_root / gate.split()[0]).exists():
        raise ConfigError(f"{d / 'fix.yaml'}: device_gate.gate names {gate.split()[0]}, which does not exist")
    if fix.kind == "diff":
        from fixpack.diffpatch import parse_diff

        patches = parse_diff(fix.change_file.read_bytes(), where=str(fix.change_file))
        declared = set(fix.target_rels)
        changed = {p.path for p in patches}
        if changed != declared:
            raise ConfigError(f"{fix.change_file}: changes {sorted(changed)} but fix.yaml declares {sorted(declared)}")
    elif fix.kind == "edit":
        from fixpack.kinds.base import ChangeError
        from fixpack.kinds.edit import load

        try:
            named = {e.target for e in load(fix.dir)}
        except ChangeError as exc:
            raise ConfigError(str(exc)) from exc
        if named != set(fix.target_rels):
            raise ConfigError(f"{fix.change_file}: edits {sorted(named)} but fix.yaml declares {sorted(fix.target_rels)}")
    else:
        import ast

        try:
            ast.parse(fix.change_file.read_bytes(), str(fix.change_file))
        except SyntaxError as exc:
            raise ConfigError(f"{fix.change_file}: does not parse: {exc.msg} at line {exc.lineno}") from exc


def _own_fix_dirs(pack):
    for name in pack.profile_names():
        try:
            yield pack.profile(name).fixes_dir
        except FixpackError:
            continue  # a malformed profile is reported with the profiles below


def run(args) -> int:
    args.pack = Path(args.pack) if args.pack else None
    pack = pack_of(args)
    errors: list[str] = []
    checked = 0
    own = sorted(set(_own_fix_dirs(pack)) - {"fixes"})  # profiles' own fix folders
    for base, layer in [(pack.root / "fixes", "profile")] + [(pack.root / d, "profile") for d in own] + [(pack.root / "ports" / n / "fixes", port_layer(n)) for n in pack.port_names()]:
        if not base.is_dir():
            continue
        for d in sorted(base.iterdir()):
            if not d.is_dir() or d.name.startswith((".", "_")):
                continue
            checked += 1
            try:
                _check_fix_dir(d, layer, pack.root)
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
