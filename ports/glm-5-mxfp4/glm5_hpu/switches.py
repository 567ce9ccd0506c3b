"""The GLM_* switches of the glm-5-mxfp4 port: declared once, in port.yaml ``switches``; parsed here.

This module is the one parser of that declaration: the model reads the environment with
:func:`read_switches`, and ``fixpack recipe check`` loads this file from the port folder and
validates a recipe's values with :func:`recipe_value_problem`. Standard library only (plus
PyYAML to read port.yaml), so it imports without torch or vLLM.

A declaration::

    GLM_MXK:
      default: auto     # the value when the variable is unset or blank
      type: bool        # bool | int | path
      reference: 0      # the port's reference path (the CPU tests' path)
      min: 1            # int only (optional), and max
      meaning: ...

bool accepts 1/0, true/false, yes/no, on/off in any case, and ``auto`` when the default is
``auto`` (the device then decides). int accepts a decimal integer within min/max. path accepts
a non-empty path, or ``none`` (no file) when the default is ``none``; the file itself is read
and checked where it is used (glm5_hpu/placement.py). A value a switch does not accept raises
:class:`SwitchError` naming the variable and the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

PORT = "glm-5-mxfp4"
PREFIX = "GLM_"
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
AUTO = "auto"
NONE = "none"
TYPES = ("bool", "int", "path")
KEYS = ("default", "type", "reference", "min", "max", "meaning")


class SwitchError(ValueError):
    """A switch value, or declaration, that cannot be used; the message names it."""


@dataclass(frozen=True)
class Switch:
    """One declared switch; ``default`` and ``reference`` are parsed values (None: auto / none)."""

    name: str
    kind: str
    default: object
    reference: object
    minimum: int | None = None
    maximum: int | None = None
    meaning: str = ""
    open_value: str | None = None  # "auto" (bool) or "none" (path) when the default is that word

    def parse(self, raw: str | None) -> object:
        """The value ``raw`` selects: the default when unset or blank; SwitchError otherwise."""
        if raw is None or not raw.strip():
            return self.default
        value, problem = self.read(raw.strip())
        if problem:
            raise SwitchError(f"{self.name}={raw!r}: {problem}")
        return value

    def read(self, raw: str) -> tuple[object, str | None]:
        """(value, None) or (None, why ``raw`` is not a value of this switch)."""
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
                return None, f"{raw!r} is not a decimal integer"
            if self.minimum is not None and n < self.minimum:
                return None, f"{n} is below the minimum {self.minimum}"
            if self.maximum is not None and n > self.maximum:
                return None, f"{n} is above the maximum {self.maximum}"
            return n, None
        # path
        if raw == NONE and self.open_value == NONE:
            return None, None
        if "\0" in raw:
            return None, "a path cannot hold a NUL character"
        if raw != raw.strip():
            return None, f"{raw!r} has leading or trailing blanks"
        return raw, None

    def canonical(self, value: object) -> str:
        """How a recipe writes ``value``: 1/0 (or auto) for a bool, the number, the path (or none)."""
        if value is None:
            return self.open_value or ""
        if self.kind == "bool":
            return "1" if value else "0"
        return str(value)

    @property
    def reference_text(self) -> str:
        return self.canonical(self.reference)


def parse_switch(name: str, entry: object, where: str = "port.yaml") -> Switch:
    """One port.yaml declaration as a :class:`Switch`; SwitchError naming the file and switch."""
    at = f"{where}: switches.{name}"
    if not name.startswith(PREFIX) or not name.replace("_", "").isalnum() or name != name.upper():
        raise SwitchError(f"{at}: a switch name is upper case and starts with {PREFIX}")
    if not isinstance(entry, dict):
        raise SwitchError(f"{at}: must be a mapping with keys default, type, reference, meaning")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise SwitchError(f"{at}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    for key in ("default", "type", "reference", "meaning"):
        if key not in entry:
            raise SwitchError(f"{at}: missing key {key!r} (every switch names its reference path)")
    kind = entry["type"]
    if kind not in TYPES:
        raise SwitchError(f"{at}: type {kind!r} is not one of {', '.join(TYPES)}")
    if kind != "int" and ("min" in entry or "max" in entry):
        raise SwitchError(f"{at}: min/max apply to type int only")
    for key in ("min", "max"):
        if key in entry and (not isinstance(entry[key], int) or isinstance(entry[key], bool)):
            raise SwitchError(f"{at}: {key} {entry[key]!r} is not an integer")
    default_text = _text(entry["default"])
    open_value = None
    if kind == "bool" and default_text == AUTO:
        open_value = AUTO
    elif kind == "path" and default_text == NONE:
        open_value = NONE
    elif kind == "path":
        raise SwitchError(f"{at}: a path switch's default must be none (a file may be missing)")
    base = Switch(name, kind, None, None, entry.get("min"), entry.get("max"),
                  str(entry["meaning"]).strip(), open_value)
    parsed = {}
    for key in ("default", "reference"):
        text = _text(entry[key])
        value, problem = base.read(text)
        if problem:
            raise SwitchError(f"{at}: {key} {entry[key]!r}: {problem}")
        parsed[key] = value
    if kind == "bool" and parsed["reference"] is None:
        raise SwitchError(f"{at}: reference must be 0 or 1, not auto (the reference path is one path)")
    if not base.meaning:
        raise SwitchError(f"{at}: 'meaning' is empty")
    return Switch(name, kind, parsed["default"], parsed["reference"], base.minimum, base.maximum,
                  base.meaning, open_value)


def _text(value: object) -> str:
    if isinstance(value, bool):  # YAML reads on/off/true/false as booleans
        return "1" if value else "0"
    return str(value)


def parse_spec(switches: object, where: str = "port.yaml") -> dict[str, Switch]:
    """port.yaml's ``switches`` mapping as {name: Switch}."""
    if not isinstance(switches, dict) or not switches:
        raise SwitchError(f"{where}: 'switches' must be a non-empty mapping of NAME: declaration")
    return {name: parse_switch(name, entry, where) for name, entry in switches.items()}


def port_yaml() -> Path:
    """This port's port.yaml: beside the package in a checkout or an editable install; in the
    port image, under the repository copy that ``$COOKBOOK`` names."""
    candidates = [Path(__file__).resolve().parents[1] / "port.yaml"]
    if os.environ.get("COOKBOOK"):
        candidates.append(Path(os.environ["COOKBOOK"]) / "ports" / PORT / "port.yaml")
    for path in candidates:
        if path.is_file():
            return path
    raise SwitchError(
        "port.yaml, which declares the GLM_* switches, was not found at "
        + " or ".join(str(p) for p in candidates) + " (set COOKBOOK to the repository copy)"
    )


def load_spec(path: Path | str | None = None) -> dict[str, Switch]:
    """The switches declared in ``path`` (default :func:`port_yaml`)."""
    import yaml

    path = Path(path) if path is not None else port_yaml()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SwitchError(f"{path}: cannot read the switches: {exc}") from exc
    return parse_spec(data.get("switches") if isinstance(data, dict) else None, where=str(path))


@dataclass(frozen=True)
class Switches:
    """The parsed switches; a field is its variable's name without GLM_, in lower case.

    None means auto (bool: the device decides) or none (path: no file)."""

    dsa_sparse: bool
    mxk: bool | None
    mxk_prefill: bool | None
    moe_tp: int
    moe_placement: str | None
    router_fast: bool
    early_draft: bool
    spec_device_reject: bool


def field_name(name: str) -> str:
    return name.removeprefix(PREFIX).lower()


def _check_matches(spec: dict[str, Switch]) -> None:
    declared = {field_name(n) for n in spec}
    expected = {f.name for f in fields(Switches)}
    if declared != expected:
        raise SwitchError(f"port.yaml switches {sorted(declared)} do not match the model's {sorted(expected)}")


def read_switches(env=None, spec: dict[str, Switch] | None = None) -> Switches:
    """Every declared switch from ``env`` (default os.environ), parsed and validated; the first
    bad value raises SwitchError naming the variable and the value."""
    env = os.environ if env is None else env
    spec = load_spec() if spec is None else spec
    _check_matches(spec)
    return Switches(**{field_name(n): s.parse(env.get(n)) for n, s in spec.items()})


def reference_switches(spec: dict[str, Switch] | None = None) -> Switches:
    """Every switch at its reference path (what the CPU reference tests run)."""
    spec = load_spec() if spec is None else spec
    _check_matches(spec)
    return Switches(**{field_name(n): s.reference for n, s in spec.items()})


def resolve_auto(value: bool | None, on_hpu: bool) -> bool:
    """An auto bool switch on this device: the device path on HPU, the reference on CPU."""
    return on_hpu if value is None else value


def recipe_value_problem(name: str, entry: object, value: str, where: str = "port.yaml") -> str | None:
    """Why a recipe's ``value`` for switch ``name`` (declared as ``entry``) is refused, or None.

    A recipe must write a value the model accepts, the canonical way (1/0 for a bool), so the
    launch block it renders has one spelling."""
    try:
        switch = parse_switch(name, entry, where)
    except SwitchError as exc:
        return str(exc)
    parsed, problem = switch.read(value)
    if problem:
        return problem
    canonical = switch.canonical(parsed)
    if value != canonical:
        return f"{value!r}: a recipe writes {canonical!r}"
    return None
