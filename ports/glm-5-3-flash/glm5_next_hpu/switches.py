"""The GLM5_NEXT_* switches of the glm-5-3-flash port: declared in port.yaml ``switches``,
parsed by fixpack's one switch parser (fixpack/pack/switches.py, which documents the declaration).

This module only names the port's port.yaml and the typed record the model reads
(:class:`Switches`, one field per switch); :func:`read_switches` parses the environment into it
at model construction, and a value a switch does not accept stops the engine with a message
naming the variable. fixpack.pack.switches is standard library only, so this imports without torch
or vLLM; fixpack is installed wherever the plugin runs (the port image's Dockerfile, the
project's venvs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fixpack.pack.switches import (  # noqa: F401  (re-exported: the port's tests and tools use these names)
    Spec,
    Switch,
    SwitchError,
    find_port_yaml,
    parse_spec,
    read_into,
    recipe_value_problem,
)
from fixpack.pack.switches import load_spec as _load_spec

PORT = "glm-5-3-flash"
PREFIX = "GLM5_NEXT_"


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


def port_yaml() -> Path:
    """This port's port.yaml (fixpack.pack.switches.find_port_yaml: the checkout, the installed
    package, or ``$COOKBOOK``)."""
    return find_port_yaml(__file__, PORT)


def load_spec(path: Path | str | None = None) -> Spec:
    """The switches declared in ``path`` (default :func:`port_yaml`)."""
    return _load_spec(port_yaml() if path is None else path)


def read_switches(env: Mapping[str, str] | None = None, spec: Spec | None = None) -> Switches:
    """Every declared switch from ``env`` (default os.environ), parsed and validated."""
    return read_into(Switches, load_spec() if spec is None else spec, env)
