"""Port switches: the one parser of every port's port.yaml ``switches`` section.

A port declares its environment switches once, in its port.yaml; this module turns that
declaration into typed :class:`Switch` records and an environment value into the value the
switch selects. Each port's plugin reads its switches through it (``glm5_next_hpu.switches``,
``glm5_hpu.switches`` are thin views that name their port.yaml and their typed record), and
``fixpack recipe check`` validates a recipe's values with :func:`recipe_value_problem`, so a
recipe cannot hold a value the plugin would read differently or refuse.

Standard library only (PyYAML when it reads a port.yaml itself): a plugin imports it in every
vLLM process without torch, vLLM or the rest of fixpack.

A port.yaml declares::

    switch_prefix: GLM_          # every switch's name starts with it (upper case)
    switches:
      GLM_MXK:
        type: bool               # bool | int | enum | path | str
        default: auto            # the value when the variable is unset or blank
        reference: 0             # the port's reference path (what its CPU tests compare)
        meaning: ...             # what it selects, for a person
        min: 1                   # int only (optional), and max
        choices: [a, b]          # enum only: the accepted values

Every switch has ``type``, ``default``, ``reference`` and a non-empty ``meaning``.

* bool accepts 1/0, true/false, yes/no and on/off in any case; where the default is ``auto``
  also ``auto`` (the code then decides, for example by device). Its reference is 0 or 1.
* int accepts a decimal integer within min/max.
* enum accepts one of ``choices``, as written.
* path accepts a non-empty path, or ``none`` (no file) where the default is ``none``; a path
  switch's default is always none, since a file may be missing. The file is checked where used.
* str accepts any non-empty text.

A value a switch does not accept raises :class:`SwitchError` naming the variable and the value;
a declaration it cannot use names the port.yaml and the switch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
AUTO = "auto"
NONE = "none"
TYPES = ("bool", "int", "enum", "path", "str")
KEYS = ("type", "default", "reference", "meaning", "min", "max", "choices")
REQUIRED = ("type", "default", "reference", "meaning")
PREFIX = re.compile(r"^[A-Z][A-Z0-9]*_(?:[A-Z0-9]+_)*$")
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


class SwitchError(ValueError):
    """A switch value, or declaration, that cannot be used; the message names it."""


@dataclass(frozen=True)
class Switch:
    """One declared switch; ``default`` and ``reference`` are parsed values (None: auto for a
    bool, none for a path)."""

    name: str
    kind: str  # one of TYPES
    default: object
    reference: object
    meaning: str = ""
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    open_value: str | None = None  # "auto" (bool) or "none" (path) when the default is that word

    @property
    def auto(self) -> bool:
        return self.open_value == AUTO

    def parse(self, raw: str | None) -> object:
        """The value ``raw`` selects: the default when unset or blank; SwitchError otherwise."""
        if raw is None or not raw.strip():
            return self.default
        value, problem = self.read(raw.strip())
        if problem:
            raise SwitchError(f"{self.name}={raw!r}: {problem}")
        return value

    def problem(self, raw: str) -> str | None:
        """Why ``raw`` is not a value of this switch, or None."""
        return self.read(raw)[1]

    def read(self, raw: str) -> tuple[object, str | None]:
        """(value, None), or (None, why ``raw`` is not a value of this switch)."""
        if self.kind == "bool":
            low = raw.lower()
            if low in TRUE:
                return True, None
            if low in FALSE:
                return False, None
            if self.open_value == AUTO and low == AUTO:
                return None, None
            also = ", or auto" if self.open_value == AUTO else ""
            return None, f"{raw!r} is not a boolean (accepted: 1/0, true/false, yes/no, on/off in any case{also})"
        if self.kind == "int":
            try:
                n = int(raw, 10)
            except ValueError:
                return None, f"{raw!r} is not an integer"
            if self.minimum is not None and n < self.minimum:
                return None, f"{n} is below the minimum {self.minimum}"
            if self.maximum is not None and n > self.maximum:
                return None, f"{n} is above the maximum {self.maximum}"
            return n, None
        if self.kind == "enum":
            if raw not in self.choices:
                return None, f"{raw!r} is not one of {', '.join(self.choices)}"
            return raw, None
        if raw == "":
            return None, "the value is empty"
        if raw != raw.strip():
            return None, f"{raw!r} has leading or trailing blanks"
        if self.kind == "path":
            if raw == NONE and self.open_value == NONE:
                return None, None
            if "\0" in raw:
                return None, "a path cannot hold a NUL character"
        return raw, None

    def canonical(self, value: object) -> str:
        """How a recipe writes ``value``: 1/0 (or auto) for a bool, the number, the choice, the
        path (or none)."""
        if value is None:
            return self.open_value or ""
        if self.kind == "bool":
            return "1" if value else "0"
        return str(value)

    @property
    def reference_text(self) -> str:
        return self.canonical(self.reference)


class Spec(dict):
    """A port's switches, {name: Switch} in declaration order, with the declaring file and the
    names' common prefix."""

    def __init__(self, switches: dict[str, Switch], prefix: str, where: str):
        super().__init__(switches)
        self.prefix = prefix
        self.where = where

    def field_name(self, name: str) -> str:
        """The switch's name in a port's typed record: without the prefix, in lower case."""
        return name.removeprefix(self.prefix).lower()


def _text(value: object) -> str:
    if isinstance(value, bool):  # YAML reads on/off/true/false as booleans
        return "1" if value else "0"
    return str(value)


def parse_switch(name: object, entry: object, where: str = "port.yaml", prefix: str | None = None) -> Switch:
    """One port.yaml declaration as a :class:`Switch`; SwitchError naming the file and the switch."""
    at = f"{where}: switches.{name}"
    if not isinstance(name, str) or not NAME.match(name) or (prefix and not name.startswith(prefix)):
        starts = f" and starts with {prefix}" if prefix else ""
        raise SwitchError(f"{at}: a switch name is upper case (A-Z, 0-9, _){starts}")
    if not isinstance(entry, dict):
        raise SwitchError(f"{at}: must be a mapping with keys {', '.join(REQUIRED)}")
    unknown = sorted(str(k) for k in set(entry) - set(KEYS))
    if unknown:
        raise SwitchError(f"{at}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    for key in REQUIRED:
        if key not in entry:
            raise SwitchError(f"{at}: missing key {key!r} (every switch has {', '.join(REQUIRED)})")
    kind = entry["type"]
    if kind not in TYPES:
        raise SwitchError(f"{at}: type {kind!r} is not one of {', '.join(TYPES)}")
    if kind != "int" and ("min" in entry or "max" in entry):
        raise SwitchError(f"{at}: min/max apply to type int only")
    for key in ("min", "max"):
        if key in entry and (not isinstance(entry[key], int) or isinstance(entry[key], bool)):
            raise SwitchError(f"{at}: {key} {entry[key]!r} is not an integer")
    if (kind == "enum") != ("choices" in entry):
        raise SwitchError(
            f"{at}: " + ("type enum needs 'choices'" if kind == "enum" else "'choices' apply to type enum only")
        )
    choices = entry.get("choices", [])
    if kind == "enum" and (not isinstance(choices, list) or not choices or len(set(map(str, choices))) != len(choices)):
        raise SwitchError(f"{at}: 'choices' must be a non-empty list of distinct values")
    meaning = str(entry["meaning"] or "").strip()
    if not meaning:
        raise SwitchError(f"{at}: 'meaning' is empty")
    default_text = _text(entry["default"])
    open_value = None
    if kind == "bool" and default_text == AUTO:
        open_value = AUTO
    elif kind == "path" and default_text == NONE:
        open_value = NONE
    elif kind == "path":
        raise SwitchError(f"{at}: a path switch's default must be none (a file may be missing)")
    base = Switch(
        name, kind, None, None, meaning, entry.get("min"), entry.get("max"), tuple(str(c) for c in choices), open_value
    )
    parsed = {}
    for key in ("default", "reference"):
        value, problem = base.read(_text(entry[key]))
        if problem:
            raise SwitchError(f"{at}: {key} {entry[key]!r}: {problem}")
        parsed[key] = value
    if kind == "bool" and parsed["reference"] is None:
        raise SwitchError(f"{at}: reference must be 0 or 1, not auto (the reference path is one path)")
    return Switch(**{**base.__dict__, **parsed})


def check_prefix(prefix: object, where: str = "port.yaml") -> str:
    if not isinstance(prefix, str) or not PREFIX.match(prefix):
        raise SwitchError(
            f"{where}: switch_prefix {prefix!r}: upper-case words ending in '_' (GLM_, GLM5_NEXT_), "
            "the start every switch name shares"
        )
    return prefix


def parse_spec(switches: object, where: str = "port.yaml", prefix: str | None = None) -> Spec:
    """port.yaml's ``switches`` mapping as a :class:`Spec`; ``prefix`` is its ``switch_prefix``."""
    if not isinstance(switches, dict) or not switches:
        raise SwitchError(f"{where}: 'switches' must be a non-empty mapping of NAME: declaration")
    if prefix is None:
        raise SwitchError(f"{where}: key 'switch_prefix' is missing (the start every switch name shares)")
    prefix = check_prefix(prefix, where)
    return Spec({name: parse_switch(name, entry, where, prefix) for name, entry in switches.items()}, prefix, where)


def spec_of(data: object, where: str = "port.yaml") -> Spec:
    """The switches of a port.yaml already read as ``data``."""
    if not isinstance(data, dict):
        raise SwitchError(f"{where}: not a mapping")
    return parse_spec(data.get("switches"), where=where, prefix=data.get("switch_prefix"))


def load_spec(path: Path | str) -> Spec:
    """The switches declared in the port.yaml at ``path``."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SwitchError(f"{path}: cannot read the switches: {exc}") from exc
    return spec_of(data, where=str(path))


def find_port_yaml(package_file: str | Path, port: str) -> Path:
    """A port's port.yaml, for its package (``package_file``: a module of the package's top
    level): beside the package in a checkout or an editable install; inside the package where
    install.sh installed it (package data); else under ``$COOKBOOK/ports/<port>/``."""
    here = Path(package_file).resolve().parent
    candidates = [here.parent / "port.yaml", here / "port.yaml"]
    if os.environ.get("COOKBOOK"):
        candidates.append(Path(os.environ["COOKBOOK"]) / "ports" / port / "port.yaml")
    for path in candidates:
        if path.is_file():
            return path
    raise SwitchError(
        f"port.yaml of port {port}, which declares its switches, was not found at "
        + " or ".join(str(p) for p in candidates)
        + " (set COOKBOOK to the repository copy in the image)"
    )


def _check_record(spec: Spec, record: type) -> None:
    declared = {spec.field_name(n) for n in spec}
    expected = {f.name for f in fields(record)}
    if declared != expected:
        raise SwitchError(
            f"{spec.where}: switches {sorted(declared)} do not match the plugin's {record.__name__} {sorted(expected)}"
        )


def read_into(record: type, spec: Spec, env: Mapping[str, str] | None = None):
    """Every declared switch from ``env`` (default os.environ), parsed into the port's typed
    ``record`` (a dataclass with one field per switch); the first bad value raises SwitchError
    naming the variable and the value."""
    env = os.environ if env is None else env
    _check_record(spec, record)
    return record(**{spec.field_name(n): s.parse(env.get(n)) for n, s in spec.items()})


def reference_into(record: type, spec: Spec):
    """Every switch at its reference path, as the port's typed ``record``."""
    _check_record(spec, record)
    return record(**{spec.field_name(n): s.reference for n, s in spec.items()})


def resolve_auto(value: bool | None, on_device: bool) -> bool:
    """An auto bool switch on this device: the device path on the accelerator, the reference
    elsewhere."""
    return on_device if value is None else value


def recipe_value_problem(
    name: str, entry: object, value: str, where: str = "port.yaml", prefix: str | None = None
) -> str | None:
    """Why a recipe's ``value`` for switch ``name`` (declared as ``entry``) is refused, or None.

    A recipe writes a value the plugin accepts, the canonical way (1/0 for a bool), so the
    launch block it renders has one spelling."""
    try:
        switch = parse_switch(name, entry, where, prefix)
    except SwitchError as exc:
        return str(exc)
    parsed, problem = switch.read(value)
    if problem:
        return problem
    canonical = switch.canonical(parsed)
    if value != canonical:
        return f"{value!r}: a recipe writes {canonical!r}"
    return None
