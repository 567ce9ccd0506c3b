"""The port's environment switches: declared once, in port.yaml ``switches``; parsed here.

This module is the one parser of that declaration. The vLLM model reads its switches
with :func:`read_switches` and passes each value to the code it selects; ``fixpack
recipe check`` validates a recipe's values with :func:`recipe_value_problem` (it loads
this file from the port folder). Standard library only, plus PyYAML when it reads
port.yaml itself, so it imports without torch or vLLM.

A switch in port.yaml::

    GLM5_NEXT_KDA_SCAN:
      default: auto        # the value when the variable is unset or empty
      type: bool           # bool, int or str; without it the default's type decides
      reference: 0         # the port's reference path (optional)
      min: 1               # int only (optional), and max
      choices: [a, b]      # the accepted values, instead of a type
      meaning: ...

A bool accepts 1/0, true/false, yes/no and on/off in any case, and ``auto`` where the
default is ``auto`` (the code then decides, for example by device). The environment
variable's value is read once, at model construction; a value the switch does not
accept stops the engine with a message naming the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

PORT = "glm-5-3-flash"
PREFIX = "GLM5_NEXT_"
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
AUTO = "auto"
KEYS = ("default", "type", "reference", "min", "max", "choices", "values", "meaning")


class SwitchError(ValueError):
    """A switch value (or a switch declaration) that cannot be used; the message names it."""


@dataclass(frozen=True)
class Switch:
    """One declared switch. ``default`` and ``reference`` are parsed values (None = auto)."""

    name: str
    kind: str  # "bool" | "int" | "choice" | "str"
    default: object
    reference: object = None
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    meaning: str = ""

    @property
    def auto(self) -> bool:
        return self.kind == "bool" and self.default is None

    def problem(self, raw: str) -> str | None:
        """Why ``raw`` is not a value of this switch, or None."""
        return self._read(raw)[1]

    def parse(self, raw: str | None) -> object:
        """The value ``raw`` selects (the default when ``raw`` is None or blank)."""
        if raw is None or not raw.strip():
            return self.default
        value, problem = self._read(raw.strip())
        if problem:
            raise SwitchError(f"{self.name}={raw!r}: {problem}")
        return value

    def canonical(self, value: object) -> str:
        """How a recipe writes ``value``: 1/0 (or auto) for a bool, the number, the choice."""
        if self.kind == "bool":
            return AUTO if value is None else "1" if value else "0"
        return str(value)

    def _read(self, raw: str) -> tuple[object, str | None]:
        if self.kind == "bool":
            low = raw.lower()
            if low in TRUE:
                return True, None
            if low in FALSE:
                return False, None
            if self.auto and low == AUTO:
                return None, None
            also = ", auto" if self.auto else ""
            return None, f"{raw!r} is not 0 or 1 (accepted: 1/0, true/false, yes/no, on/off in any case{also})"
        if self.kind == "int":
            try:
                n = int(raw)
            except ValueError:
                return None, f"{raw!r} is not an integer"
            if self.minimum is not None and n < self.minimum:
                return None, f"{n} is below the minimum {self.minimum}"
            if self.maximum is not None and n > self.maximum:
                return None, f"{n} is above the maximum {self.maximum}"
            return n, None
        if self.kind == "choice":
            if raw not in self.choices:
                return None, f"{raw!r} is not one of {', '.join(self.choices)}"
            return raw, None
        if raw == "":
            return None, "the value is empty"
        return raw, None


def parse_switch(name: str, entry: object, where: str = "port.yaml") -> Switch:
    """A port.yaml ``switches`` entry as a :class:`Switch`; SwitchError naming the file and
    the switch when the declaration itself is unusable."""
    at = f"{where}: switches.{name}"
    if not isinstance(entry, dict):
        entry = {"default": entry}
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise SwitchError(f"{at}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    if "default" not in entry:
        raise SwitchError(f"{at}: missing key 'default'")
    default = entry["default"]
    choices = entry.get("choices", entry.get("values"))
    kind = entry.get("type")
    if choices is not None:
        if not isinstance(choices, list) or not choices:
            raise SwitchError(f"{at}: 'choices' must be a non-empty list")
        kind = "choice"
    elif kind is None:
        kind = "bool" if isinstance(default, bool) else "int" if isinstance(default, int) else "str"
    elif kind not in ("bool", "int", "str"):
        raise SwitchError(f"{at}: type {kind!r} is not one of bool, int, str")
    base = Switch(
        name=name,
        kind=kind,
        default=None,
        minimum=entry.get("min"),
        maximum=entry.get("max"),
        choices=tuple(str(c) for c in choices or ()),
        meaning=str(entry.get("meaning", "")).strip(),
    )
    values = {}
    for key in ("default", "reference"):
        if key not in entry:
            continue
        text = str(entry[key]).lower() if isinstance(entry[key], bool) else str(entry[key])
        if kind == "bool" and key == "default" and text == AUTO:
            values[key] = None
            continue
        if kind == "bool" and isinstance(entry[key], bool):
            text = "1" if entry[key] else "0"
        value, problem = base._read(text)
        if problem:
            raise SwitchError(f"{at}: {key} {entry[key]!r}: {problem}")
        values[key] = value
    return Switch(**{**base.__dict__, **values})


def parse_spec(switches: object, where: str = "port.yaml") -> dict[str, Switch]:
    """port.yaml's ``switches`` mapping as {name: Switch}."""
    if not isinstance(switches, dict):
        raise SwitchError(f"{where}: 'switches' must be a mapping of NAME: declaration")
    return {name: parse_switch(name, entry, where) for name, entry in switches.items()}


def port_yaml() -> Path:
    """port.yaml of this port: beside the package in a checkout (or an editable install); inside
    the package where install.sh installed it (package data); else under ``$COOKBOOK``."""
    here = Path(__file__).resolve()
    candidates = [here.parents[1] / "port.yaml", here.parent / "port.yaml"]
    if os.environ.get("COOKBOOK"):
        candidates.append(Path(os.environ["COOKBOOK"]) / "ports" / PORT / "port.yaml")
    for path in candidates:
        if path.is_file():
            return path
    raise SwitchError(
        "port.yaml, which declares the GLM5_NEXT_* switches, was not found at "
        + " or ".join(str(p) for p in candidates)
        + " (set COOKBOOK to the repository copy in the image)"
    )


def load_spec(path: Path | str | None = None) -> dict[str, Switch]:
    """The switches declared in ``path`` (default :func:`port_yaml`)."""
    import yaml

    path = Path(path) if path is not None else port_yaml()
    data = yaml.safe_load(path.read_text()) or {}
    return parse_spec(data.get("switches", {}), where=str(path))


@dataclass(frozen=True)
class Switches:
    """The parsed switches; each field is its variable's name without GLM5_NEXT_, lower case."""

    vision: bool
    image_max_tokens: int
    kda_scan: bool | None  # None: the kernel's default for the device (scan on HPU)
    decode_layer_group: int
    mhc_sinkhorn: str
    moe_op: str  # "exact" (the port's loop, the clamp) or "fused" (vllm-gaudi's FP8 MoE op, no clamp)


def field_name(name: str) -> str:
    return name.removeprefix(PREFIX).lower()


def read_switches(env=None, spec: dict[str, Switch] | None = None) -> Switches:
    """Every declared switch from ``env`` (default os.environ), parsed and validated."""
    env = os.environ if env is None else env
    spec = load_spec() if spec is None else spec
    declared = {field_name(n) for n in spec}
    expected = {f.name for f in fields(Switches)}
    if declared != expected:
        raise SwitchError(
            f"port.yaml switches {sorted(declared)} do not match the plugin's {sorted(expected)}"
        )
    return Switches(**{field_name(n): s.parse(env.get(n)) for n, s in spec.items()})


def recipe_value_problem(name: str, entry: object, value: str, where: str = "port.yaml") -> str | None:
    """Why a recipe's ``value`` for switch ``name`` (declared as ``entry``) is refused, or None.

    Any spelling the plugin accepts is a valid value; a recipe must also write it the
    canonical way (1/0 for a bool), so the launch block it renders shows one spelling."""
    try:
        switch = parse_switch(name, entry, where)
    except SwitchError as exc:
        return str(exc)
    problem = switch.problem(value)
    if problem:
        return problem
    canonical = switch.canonical(switch.parse(value))
    if value != canonical:
        if switch.kind == "bool":
            return f"{value!r} is not 0 or 1: a recipe writes {canonical!r}"
        return f"{value!r}: a recipe writes {canonical!r}"
    return None
