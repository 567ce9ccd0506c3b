"""The pack: fixes, profiles and ports read from the repository, validated, and ordered."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fixpack import kinds
from fixpack.apply.hashing import fix_hash
from fixpack.apply.locations import port_layer
from fixpack.errors import ConfigError
from fixpack.pack import schema
from fixpack.pack.paths import check_relpath


def default_pack_root() -> Path:
    env = os.environ.get("FIXPACK_PACK")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[2]


@dataclass
class Target:
    package: str
    path: str

    @property
    def rel(self) -> str:
        return f"{self.package}/{self.path}"


@dataclass
class Fix:
    """A fix as it applies on one release (``release``, a profile name): fix.yaml's keys with
    that release's entry laid over them, and that release's change file."""

    id: str
    dir: Path
    kind: str
    targets: list[Target]
    meta: dict
    layer: str = "profile"  # or "port:<name>"
    release: str | None = None  # None: the fix as a whole (validate), not one release's view
    changes_in: Path | None = None  # dir/<release> when that release is refreshed; None: dir

    @property
    def change_dir(self) -> Path:
        """The folder of this release's change file (what a kind's ``apply`` reads)."""
        return self.changes_in or self.dir

    @property
    def change_file(self) -> Path:
        return self.change_dir / kinds.CHANGE_FILES[self.kind]

    @property
    def releases(self) -> dict[str, dict]:
        return dict(self.meta["releases"])

    @property
    def status(self) -> dict | None:
        """This release's entry of fix.yaml ``releases:`` (None for the whole-fix view)."""
        return self.meta["releases"].get(self.release) if self.release else None

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
        """Hash of the fix's own files for its release (fix.yaml and that release's change),
        recorded in the state and pinned in the lock."""
        return fix_hash(self.dir, self.change_file)


def release_change_dir(fix_dir: Path, release: str, status: str) -> Path:
    """Where a release's change file is: its own folder when refreshed, else the shared one."""
    return fix_dir / release if status == "refreshed" else fix_dir


def _check_releases(fix_dir: Path, data: dict, kind: str, where: str) -> None:
    """fix.yaml ``releases:``: every entry well formed, every change file used by a release."""
    change_name = kinds.CHANGE_FILES[kind]
    rels = data["releases"]
    if not rels:
        raise ConfigError(f"{where}: key 'releases' is empty: name at least the release the fix applies to")
    shared_used = False
    for rel, entry in rels.items():
        at = f"{where}: releases.{rel}"
        schema.check_slug(str(rel), where=f"{where}: releases key")
        if isinstance(entry, str):
            raise ConfigError(f"{at} must be a mapping such as {{status: {entry}}}, found a string")
        entry = schema.check_mapping(entry, schema.RELEASE_SCHEMA, where=at)
        status = entry["status"]
        if status not in schema.RELEASE_STATUSES:
            raise ConfigError(f"{at}.status must be one of {', '.join(schema.RELEASE_STATUSES)}, found {status!r}")
        for key in schema.RELEASE_REQUIRED[status]:
            if key not in entry:
                raise ConfigError(f"{at}: status {status} needs key {key!r} ({schema.RELEASE_SCHEMA[key][2]})")
        if status not in schema.RELEASE_APPLIED:
            extra = [k for k in entry if k in schema.RELEASE_OVERRIDES and k != "evidence"]
            if extra:
                raise ConfigError(f"{at}: status {status} applies no change, so key {extra[0]!r} has nothing to describe")
        elif "upstream" in entry:
            raise ConfigError(f"{at}: key 'upstream' belongs to status upstream, not {status}")
        own = fix_dir / str(rel)
        has_own = (own / change_name).is_file()
        if status == "refreshed" and not has_own:
            raise ConfigError(f"{at}: status refreshed but {own.name}/{change_name} does not exist in {fix_dir} (a refreshed release has its own change file)")
        if status != "refreshed" and own.is_dir() and any((own / n).exists() for n in kinds.CHANGE_FILES.values()):
            raise ConfigError(f"{at}: status {status} but {own} holds a change file; only a refreshed release has its own")
        shared_used |= status == "applies"
        for other_kind, name in kinds.CHANGE_FILES.items():
            if other_kind != kind and (own / name).exists():
                raise ConfigError(f"{at}: kind is {kind!r} but {own.name}/{name} exists; keep one kind per fix")
        if status == "refreshed":
            schema.check_size(own / change_name)
    for sub in sorted(p for p in fix_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if sub.name not in rels and any((sub / n).exists() for n in kinds.CHANGE_FILES.values()):
            raise ConfigError(f"{where}: {sub.name}/ holds a change file but 'releases' has no entry {sub.name!r}")
    shared = fix_dir / change_name
    if shared_used and not shared.is_file():
        raise ConfigError(f"{where}: a release has status applies but {change_name} does not exist in {fix_dir}")
    if shared.is_file() and not shared_used:
        raise ConfigError(f"{where}: {change_name} is used by no release (none has status applies); move it to the release folder that uses it")
    if shared.is_file():
        schema.check_size(shared)


def release_view(fix: Fix, release: str) -> Fix:
    """``fix`` as it applies on ``release``; ConfigError naming fix.yaml when it does not."""
    where = f"{fix.dir / 'fix.yaml'}: releases"
    entry = fix.meta["releases"].get(release)
    if entry is None:
        known = ", ".join(f"{r} ({e['status']})" for r, e in fix.meta["releases"].items())
        raise ConfigError(
            f"{where} has no entry {release!r} (it has: {known}); add `{release}: {{status: applies}}` "
            f"(or refreshed, with its own {release}/{kinds.CHANGE_FILES[fix.kind]}) once `fixpack check --profile {release} --only {fix.id}` is green"
        )
    status = entry["status"]
    if status not in schema.RELEASE_APPLIED:
        reason = str(entry.get("why") or entry.get("evidence") or "").strip().splitlines()
        raise ConfigError(f"{where}.{release}: status {status}{' (' + reason[0] + ')' if reason else ''}, so no profile of {release} may list {fix.id}")
    meta = dict(fix.meta)
    for key in schema.RELEASE_OVERRIDES:
        if key in entry:
            meta[key] = entry[key]
    return Fix(fix.id, fix.dir, fix.kind, fix.targets, meta, fix.layer, release, release_change_dir(fix.dir, release, status))


def load_fix(fix_dir: Path, *, layer: str = "profile", release: str | None = None) -> Fix:
    """The fix of ``fix_dir``, validated as a whole; with ``release``, its view on that release."""
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
    _check_releases(fix_dir, data, kind, where)
    scopes = [("", data)] + [(f"releases.{r}.", e) for r, e in data["releases"].items()]
    for prefix, scope in scopes:
        for i, pin in enumerate(scope.get("pins_defect_tests") or []):
            pin = schema.check_mapping(pin, schema.PINS_DEFECT_TEST_SCHEMA, where=f"{where}: {prefix}pins_defect_tests[{i}]")
            if "::" not in pin["test"] or not pin["test"].split("::", 1)[0].endswith(".py"):
                raise ConfigError(f"{where}: {prefix}pins_defect_tests[{i}].test must be FILE.py::NAME, found {pin['test']!r}")
        for i, r in enumerate(scope.get("requires", [])):
            schema.check_slug(r, where=f"{where}: {prefix}requires[{i}]")
    for other_kind, name in kinds.CHANGE_FILES.items():
        if other_kind != kind and (fix_dir / name).exists():
            raise ConfigError(f"{where}: kind is {kind!r} but {name} exists too; keep one change per fix")
    fix = Fix(fid, fix_dir, kind, targets, data, layer)
    return release_view(fix, release) if release is not None else fix


@dataclass
class ProfileEntry:
    id: str
    opt_in: bool


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
        raw = schema.load_yaml(path)
        for key, instead in schema.PROFILE_RETIRED_KEYS.items():
            if isinstance(raw, dict) and key in raw:
                raise ConfigError(f"{where}: key {key!r} is no longer read: {instead}")
        data = schema.check_mapping(raw, schema.PROFILE_SCHEMA, where=where)
        if data["name"] != name:
            raise ConfigError(f"{where}: key 'name' is {data['name']!r}, the file is {name}.yaml")
        entries: list[ProfileEntry] = []
        for i, e in enumerate(data["fixes"]):
            if isinstance(e, str):
                e = {"id": e}
            if isinstance(e, dict) and "dir" in e:
                raise ConfigError(f"{where}: fixes[{i}]: key 'dir' is no longer read: {schema.PROFILE_RETIRED_KEYS['dir']}")
            e = schema.check_mapping(e, schema.PROFILE_FIX_SCHEMA, where=f"{where}: fixes[{i}]")
            schema.check_slug(e["id"], where=f"{where}: fixes[{i}].id")
            if any(x.id == e["id"] for x in entries):
                raise ConfigError(f"{where}: fixes[{i}]: {e['id']!r} is listed twice")
            entries.append(ProfileEntry(e["id"], bool(e.get("opt_in", False))))
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
    def fix_dir(self, fid: str, port: Port | None = None) -> Path:
        return ((port.dir / "fixes") if port else (self.root / "fixes")) / fid

    def fix(self, fid: str, *, port: Port | None = None, release: str | None = None) -> Fix:
        """Fix ``fid`` (a port's when ``port``) as it applies on ``release`` (a port's fixes: on
        the port's profile); ``release=None`` and no port: the fix as a whole."""
        if port is not None and release is None:
            release = port.profile
        key = (fid, port.name if port else None, release)
        if key not in self._fix_cache:
            d = self.fix_dir(fid, port)
            if not d.is_dir():
                raise ConfigError(f"fix {fid!r} has no folder {d}")
            self._fix_cache[key] = load_fix(d, layer=port_layer(port.name if port else None), release=release)
        return self._fix_cache[key]

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
        fixes += [self.fix(e.id, release=profile.name) for e in profile.entries if not e.opt_in or e.id in chosen]
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
