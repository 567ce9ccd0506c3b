"""The GLM_* switches of the glm-5-mxfp4 port: declared in port.yaml ``switches``, parsed by
fixpack's one switch parser (fixpack/pack/switches.py, which documents the declaration).

This module only names the port's port.yaml and the typed record the model reads
(:class:`Switches`, one field per switch): the model reads the environment with
:func:`read_switches`, the CPU reference tests run :func:`reference_switches`. A value a switch
does not accept raises SwitchError naming the variable and the value. fixpack.pack.switches is
standard library only, so this imports without torch or vLLM; fixpack is installed wherever the
plugin runs (the port image's Dockerfile, the project's venvs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fixpack.pack.switches import (  # noqa: F401  (re-exported: the port's code and tests use these names)
    Spec,
    Switch,
    SwitchError,
    find_port_yaml,
    parse_spec,
    read_into,
    recipe_value_problem,
    reference_into,
)
from fixpack.pack.switches import load_spec as _load_spec
from fixpack.pack.switches import resolve_auto as _resolve_auto

PORT = "glm-5-mxfp4"
PREFIX = "GLM_"


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


def port_yaml() -> Path:
    """This port's port.yaml: beside the package in a checkout or an editable install; in the
    port image, under the repository copy that ``$COOKBOOK`` names."""
    return find_port_yaml(__file__, PORT)


def load_spec(path: Path | str | None = None) -> Spec:
    """The switches declared in ``path`` (default :func:`port_yaml`)."""
    return _load_spec(port_yaml() if path is None else path)


def read_switches(env: Mapping[str, str] | None = None, spec: Spec | None = None) -> Switches:
    """Every declared switch from ``env`` (default os.environ), parsed and validated; the first
    bad value raises SwitchError naming the variable and the value."""
    return read_into(Switches, load_spec() if spec is None else spec, env)


def reference_switches(spec: Spec | None = None) -> Switches:
    """Every switch at its reference path (what the CPU reference tests run)."""
    return reference_into(Switches, load_spec() if spec is None else spec)


def resolve_auto(value: bool | None, on_hpu: bool) -> bool:
    """An auto bool switch on this device: the device path on HPU, the reference on CPU."""
    return _resolve_auto(value, on_hpu)
