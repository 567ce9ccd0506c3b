"""The pack: fixes, profiles and ports read from the repository, validated, and ordered."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from fixpack import kinds, schema
from fixpack.errors import ConfigError
from fixpack.locations import port_layer
from fixpack.paths import check_relpath


def default_pack_root() -> Path:
    env = os.environ.get("FIXPACK_PACK")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parent.parent


@dataclass
class Target:
    package: str
    path: str

    @property
    def rel(self) -> str:
        return f"{self.package}/{self.path}"


@dataclass
class Fix:
    id: str
    dir: Path
    kind: str
    targets: list[Target]
    meta: dict
    layer: str = "profile"  # or "port:<name>"

    @property
    def change_file(self) -> Path:
        return self.dir / kinds.CHANGE_FILES[self.kind]

    @property
    def cpu_demonstrable(self) -> bool:
        return bool(self.meta.get("cpu_demonstrable", True))

    @property
    def requires(self) -> list[str]:
        return list(self.meta.get("requires", []))

    @property
    def target_rels(self) -> list[str]:
        return [t.rel for t in self.targets]

    def content_hash(self) -> str:
        """Hash of the fix's own files (fix.yaml and its change), recorded in the state."""
        h = hashlib.sha256()
        for p in (self.dir / "fix.yaml", self.change_file):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()


def load_fix(fix_dir: Path, *, layer: str = "profile") -> Fix:
    path = fix_dir / "fix.yaml"
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"{fix_dir}: no fix.yaml (every fix folder needs one)")
    data = schema.check_mapping(schema.load_yaml(path), schema.FIX_SCHEMA, where=where)
    fid = schema.check_slug(data["id"], where=f"{where}: key 'id'")
    if fid != fix_dir.name:
        raise ConfigError(f"{where}: key 'id' is {fid!r} but the folder is {fix_dir.name!r}")
    kind = data["kind"]
    if kind not in kinds.KINDS:
        raise ConfigError(f"{where}: key 'kind' must be one of {', '.join(kinds.KINDS)}, found {kind!r}")
    if not data["targets"]:
        raise ConfigError(f"{where}: key 'targets' is empty")
    targets: list[Target] = []
    for i, t in enumerate(data["targets"]):
        t = schema.check_mapping(t, schema.TARGET_SCHEMA, where=f"{where}: targets[{i}]")
        schema.check_slug(t["package"].replace("_", "-"), where=f"{where}: targets[{i}].package")
        check_relpath(t["path"], where=f"{where}: targets[{i}].path")
        tg = Target(t["package"], t["path"])
        if tg.rel in [x.rel for x in targets]:
            raise ConfigError(f"{where}: targets[{i}] {tg.rel} is listed twice")
        targets.append(tg)
    for i, name in enumerate(data["tests"]):
        if not isinstance(name, str):
            raise ConfigError(f"{where}: tests[{i}] must be a file name")
        check_relpath(name, where=f"{where}: tests[{i}]")
        if not (fix_dir / name).is_file():
            raise ConfigError(f"{where}: tests[{i}] names {name}, which does not exist in {fix_dir}")
    if not data["tests"]:
        raise ConfigError(f"{where}: key 'tests' is empty: every fix needs a regression test")
    if data.get("cpu_demonstrable", True) is False:
        if "device_gate" not in data:
            raise ConfigError(f"{where}: cpu_demonstrable is false, so key 'device_gate' ({{reason, gate}}) is required")
    if "device_gate" in data:
        schema.check_mapping(data["device_gate"], schema.DEVICE_GATE_SCHEMA, where=f"{where}: device_gate")
    for i, pin in enumerate(data.get("pins_defect_tests") or []):
        pin = schema.check_mapping(pin, schema.PINS_DEFECT_TEST_SCHEMA, where=f"{where}: pins_defect_tests[{i}]")
        if "::" not in pin["test"] or not pin["test"].split("::", 1)[0].endswith(".py"):
            raise ConfigError(f"{where}: pins_defect_tests[{i}].test must be FILE.py::NAME, found {pin['test']!r}")
    for i, r in enumerate(data.get("requires", [])):
        schema.check_slug(r, where=f"{where}: requires[{i}]")
    fix = Fix(fid, fix_dir, kind, targets, data, layer)
    if not fix.change_file.is_file():
        raise ConfigError(f"{where}: kind is {kind!r} but {fix.change_file.name} does not exist in {fix_dir}")
    schema.check_size(fix.change_file)
    for other_kind, name in kinds.CHANGE_FILES.items():
        if other_kind != kind and (fix_dir / name).exists():
            raise ConfigError(f"{where}: kind is {kind!r} but {name} exists too; keep one change per fix")
    return fix


@dataclass
class ProfileEntry:
    id: str
    opt_in: bool
    dir: str | None = None  # relative to the pack; None: <fixes_dir>/<id>


@dataclass
class Profile:
    name: str
    path: Path
    base: dict
    packages: list[str]
    entries: list[ProfileEntry]
    data: dict

    @property
    def manifest_path(self) -> Path:
        return self.path.with_name(f"{self.name}.manifest.json")

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(f"{self.name}.lock.json")

    @property
    def fixes_dir(self) -> str:
        return self.data.get("fixes_dir", "fixes")

    def development_parts(self) -> dict[str, dict]:
        """Packages whose release sources have a development base named (``development:``)."""
        return {p: s["development"] for p, s in self.base.get("sources", {}).items() if isinstance(s, dict) and s.get("development")}

    @property
    def opt_ins(self) -> list[str]:
        return [e.id for e in self.entries if e.opt_in]

    @property
    def defaults(self) -> list[str]:
        return [e.id for e in self.entries if not e.opt_in]


@dataclass
class Port:
    name: str
    dir: Path
    profile: str
    patches: list[str]
    data: dict


@dataclass
class Pack:
    root: Path
    _fix_cache: dict = field(default_factory=dict)

    # ---- profiles
    def profile_names(self) -> list[str]:
        d = self.root / "profiles"
        return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []

    def profile(self, name: str) -> Profile:
        path = self.root / "profiles" / f"{name}.yaml"
        if not path.is_file():
            known = ", ".join(self.profile_names()) or "none"
            raise ConfigError(f"unknown profile {name!r} (known: {known}); profiles live in {self.root / 'profiles'}")
        where = str(path)
        data = schema.check_mapping(schema.load_yaml(path), schema.PROFILE_SCHEMA, where=where)
        if data["name"] != name:
            raise ConfigError(f"{where}: key 'name' is {data['name']!r}, the file is {name}.yaml")
        entries: list[ProfileEntry] = []
        for i, e in enumerate(data["fixes"]):
            if isinstance(e, str):
                e = {"id": e}
            e = schema.check_mapping(e, schema.PROFILE_FIX_SCHEMA, where=f"{where}: fixes[{i}]")
            schema.check_slug(e["id"], where=f"{where}: fixes[{i}].id")
            if any(x.id == e["id"] for x in entries):
                raise ConfigError(f"{where}: fixes[{i}]: {e['id']!r} is listed twice")
            if "dir" in e:
                check_relpath(e["dir"], where=f"{where}: fixes[{i}].dir")
            entries.append(ProfileEntry(e["id"], bool(e.get("opt_in", False)), e.get("dir")))
        if "fixes_dir" in data:
            check_relpath(data["fixes_dir"], where=f"{where}: key 'fixes_dir'")
        for i, p in enumerate(data["packages"]):
            if not isinstance(p, str) or not p.isidentifier():
                raise ConfigError(f"{where}: packages[{i}] must be a package name")
        return Profile(name, path, data["base"], list(data["packages"]), entries, data)

    # ---- ports
    def port_names(self) -> list[str]:
        d = self.root / "ports"
        return sorted(p.parent.name for p in d.glob("*/port.yaml")) if d.is_dir() else []

    def port(self, name: str) -> Port:
        path = self.root / "ports" / name / "port.yaml"
        if not path.is_file():
            known = ", ".join(self.port_names()) or "none"
            raise ConfigError(f"unknown port {name!r} (known: {known})")
        where = str(path)
        data = schema.check_mapping(schema.load_yaml(path), schema.PORT_SCHEMA, where=where)
        if data["name"] != name:
            raise ConfigError(f"{where}: key 'name' is {data['name']!r}, the folder is {name}")
        patches = []
        for i, p in enumerate(data["patches"]):
            schema.check_slug(p, where=f"{where}: patches[{i}]")
            if p in patches:
                raise ConfigError(f"{where}: patches[{i}]: {p!r} is listed twice")
            patches.append(p)
        return Port(name, path.parent, data["profile"], patches, data)

    # ---- fixes
    def fix(self, fid: str, *, port: Port | None = None, rel_dir: str | None = None) -> Fix:
        key = (fid, port.name if port else None, rel_dir)
        if key not in self._fix_cache:
            base = (port.dir / "fixes") if port else (self.root / "fixes")
            d = self.root / rel_dir if rel_dir else base / fid
            if not d.is_dir():
                raise ConfigError(f"fix {fid!r} has no folder {d}")
            self._fix_cache[key] = load_fix(d, layer=port_layer(port.name if port else None))
        return self._fix_cache[key]

    @staticmethod
    def entry_dir(profile: Profile, e: ProfileEntry) -> str | None:
        """The folder of a profile's fix relative to the pack; None for the default fixes/<id>."""
        if e.dir:
            return e.dir
        return None if profile.fixes_dir == "fixes" else f"{profile.fixes_dir}/{e.id}"

    def selection(self, profile: Profile, opt_ins: list[str] | tuple[str, ...] = (), port: Port | None = None) -> list[Fix]:
        """Port patches first (the layer below), then the profile's defaults and the named
        opt-ins, always in pack order whatever order they were named in."""
        valid = profile.opt_ins
        for name in opt_ins:
            if name not in valid:
                hint = " (did you mean an option? opt-in names never start with '-')" if name.startswith("-") else ""
                raise ConfigError(
                    f"unknown opt-in fix {name!r} for profile {profile.name}{hint}; valid opt-ins: {', '.join(valid) or 'none'}"
                )
        chosen = set(opt_ins)
        fixes: list[Fix] = []
        if port is not None:
            if port.profile != profile.name:
                raise ConfigError(f"port {port.name} is built on profile {port.profile}, not {profile.name}")
            fixes += [self.fix(p, port=port) for p in port.patches]
        fixes += [self.fix(e.id, rel_dir=self.entry_dir(profile, e)) for e in profile.entries if not e.opt_in or e.id in chosen]
        ids = [f.id for f in fixes]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ConfigError(f"fix id(s) {', '.join(dup)} appear both in the port and in the profile")
        for i, f in enumerate(fixes):
            for r in f.requires:
                if r not in ids[:i]:
                    where = f"{f.dir / 'fix.yaml'}: requires"
                    if r in ids:
                        raise ConfigError(f"{where}: {r!r} comes after {f.id} in the pack order (or requirements form a cycle)")
                    raise ConfigError(f"{where}: {r!r} is not part of this selection")
            for t in f.targets:
                allowed = profile.packages
                if t.package not in allowed:
                    raise ConfigError(f"{f.dir / 'fix.yaml'}: target package {t.package!r} is not one of the profile's packages ({', '.join(allowed)})")
        return fixes
