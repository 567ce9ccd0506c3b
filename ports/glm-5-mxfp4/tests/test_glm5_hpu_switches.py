"""The GLM_* switches: declared once in port.yaml, parsed by glm5_hpu/switches.py, validated with
messages that name the variable and the value; `fixpack recipe check` uses the same parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from glm5_hpu import switches as sw
from glm5_hpu.switches import SwitchError, load_spec, read_switches, recipe_value_problem, reference_switches

PORT = Path(__file__).resolve().parents[1]
REPO = PORT.parents[1]

# The GLM-5.3 recipe's launch block, as it exports the port's switches.
SEED = {
    "GLM_DSA_SPARSE": "1",
    "GLM_MXK": "1",
    "GLM_MXK_PREFILL": "1",
    "GLM_MOE_TP": "2",
    "GLM_MOE_PLACEMENT": "/opt/gaudi-cookbook/ports/glm-5-mxfp4/serving/glm53-ep4-placement.json",
    "GLM_ROUTER_FAST": "1",
    "GLM_EARLY_DRAFT": "1",
    "GLM_SPEC_DEVICE_REJECT": "1",
}
TRUE = ["1", "true", "True", "TRUE", "yes", "YES", "on", "On", " 1 "]
FALSE = ["0", "false", "FALSE", "no", "No", "off", "OFF"]
BOOLS = ["GLM_DSA_SPARSE", "GLM_MXK", "GLM_MXK_PREFILL", "GLM_ROUTER_FAST", "GLM_EARLY_DRAFT", "GLM_SPEC_DEVICE_REJECT"]


def test_port_yaml_declares_exactly_the_seeds_switches_each_with_a_reference():
    spec = load_spec(PORT / "port.yaml")
    assert list(spec) == list(SEED)
    for name, s in spec.items():
        assert s.meaning, name
        # the reference path is one definite path, never "auto"
        assert s.reference is not None or s.kind == "path", name
    assert read_switches(SEED).moe_tp == 2


def test_unset_gives_the_declared_defaults_and_the_reference_is_every_path_off():
    assert read_switches({}) == sw.Switches(
        dsa_sparse=True,
        mxk=None,
        mxk_prefill=None,
        moe_tp=1,
        moe_placement=None,
        router_fast=True,
        early_draft=True,
        spec_device_reject=True,
    )
    assert reference_switches() == sw.Switches(
        dsa_sparse=False,
        mxk=False,
        mxk_prefill=False,
        moe_tp=1,
        moe_placement=None,
        router_fast=False,
        early_draft=False,
        spec_device_reject=False,
    )
    # blank counts as unset
    assert read_switches({n: "  " for n in SEED}) == read_switches({})


def test_the_seeds_values_parse_to_what_they_name():
    s = read_switches(SEED)
    assert s == sw.Switches(
        dsa_sparse=True,
        mxk=True,
        mxk_prefill=True,
        moe_tp=2,
        moe_placement=SEED["GLM_MOE_PLACEMENT"],
        router_fast=True,
        early_draft=True,
        spec_device_reject=True,
    )


@pytest.mark.parametrize("name", BOOLS)
@pytest.mark.parametrize("spelling", TRUE + FALSE)
def test_every_boolean_spelling(name, spelling):
    value = getattr(read_switches({name: spelling}), sw.field_name(name))
    assert value is (spelling in TRUE)


@pytest.mark.parametrize("name", ["GLM_MXK", "GLM_MXK_PREFILL"])
def test_auto_is_accepted_only_where_the_default_is_auto(name):
    assert getattr(read_switches({name: "AUTO"}), sw.field_name(name)) is None
    assert sw.resolve_auto(None, on_hpu=False) is False and sw.resolve_auto(None, on_hpu=True) is True
    assert sw.resolve_auto(False, on_hpu=True) is False
    with pytest.raises(SwitchError, match=r"GLM_DSA_SPARSE='auto': 'auto' is not a boolean"):
        read_switches({"GLM_DSA_SPARSE": "auto"})


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "GLM_DSA_SPARSE",
            "2",
            r"GLM_DSA_SPARSE='2': '2' is not a boolean \(accepted: 1/0, true/false, yes/no, on/off in any case\)",
        ),
        ("GLM_MXK", "enabled", r"GLM_MXK='enabled': 'enabled' is not a boolean .* or auto\)"),
        ("GLM_ROUTER_FAST", "y", r"GLM_ROUTER_FAST='y': 'y' is not a boolean"),
        ("GLM_EARLY_DRAFT", "1.0", r"GLM_EARLY_DRAFT='1.0': '1.0' is not a boolean"),
        ("GLM_SPEC_DEVICE_REJECT", "-1", r"GLM_SPEC_DEVICE_REJECT='-1'"),
        ("GLM_MOE_TP", "0", r"GLM_MOE_TP='0': 0 is below the minimum 1"),
        ("GLM_MOE_TP", "two", r"GLM_MOE_TP='two': 'two' is not an integer"),
        ("GLM_MOE_TP", "2.5", r"GLM_MOE_TP='2.5': '2.5' is not an integer"),
        ("GLM_MOE_PLACEMENT", "a\0b", r"GLM_MOE_PLACEMENT='a\\x00b': a path cannot hold a NUL character"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_value(name, value, message):
    with pytest.raises(SwitchError, match=message):
        read_switches({name: value})


def test_placement_none_is_no_file_and_a_path_is_kept_as_written():
    assert read_switches({"GLM_MOE_PLACEMENT": "none"}).moe_placement is None
    assert read_switches({"GLM_MOE_PLACEMENT": "p.json"}).moe_placement == "p.json"


def _declared():
    return yaml.safe_load((PORT / "port.yaml").read_text())["switches"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["GLM_MXK"].pop("reference"), r"switches.GLM_MXK: missing key 'reference'"),
        (lambda d: d["GLM_MXK"].update(reference="auto"), r"switches.GLM_MXK: reference must be 0 or 1, not auto"),
        (
            lambda d: d["GLM_MOE_TP"].update(type="float"),
            r"switches.GLM_MOE_TP: type 'float' is not one of bool, int, enum, path, str",
        ),
        (lambda d: d["GLM_MOE_TP"].update(default=0), r"switches.GLM_MOE_TP: default 0: 0 is below the minimum 1"),
        (lambda d: d["GLM_MOE_TP"].update(step=2), r"switches.GLM_MOE_TP: unknown key\(s\) step"),
        (lambda d: d["GLM_DSA_SPARSE"].update(min=1), r"switches.GLM_DSA_SPARSE: min/max apply to type int only"),
        (lambda d: d["GLM_DSA_SPARSE"].update(default="sometimes"), r"switches.GLM_DSA_SPARSE: default 'sometimes'"),
        (
            lambda d: d["GLM_MOE_PLACEMENT"].update(default="/x.json"),
            r"switches.GLM_MOE_PLACEMENT: a path switch's default must be none",
        ),
        (lambda d: d["GLM_EARLY_DRAFT"].update(meaning=""), r"switches.GLM_EARLY_DRAFT: 'meaning' is empty"),
        (
            lambda d: d.update(glm_lower={"default": 1}),
            r"switches.glm_lower: a switch name is upper case \(A-Z, 0-9, _\) and starts with GLM_",
        ),
        (
            lambda d: d.update(GLM5_OTHER={"default": 1}),
            r"switches.GLM5_OTHER: a switch name is upper case .* and starts with GLM_",
        ),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_file_and_the_switch(tmp_path, change, message):
    d = _declared()
    change(d)
    path = tmp_path / "port.yaml"
    path.write_text(yaml.safe_dump({"switch_prefix": "GLM_", "switches": d}))
    with pytest.raises(SwitchError, match=message) as exc:
        load_spec(path)
    assert str(path) in str(exc.value)


def test_a_switch_the_model_does_not_know_is_refused(tmp_path):
    d = _declared()
    d["GLM_NEW"] = {"default": 1, "type": "bool", "reference": 0, "meaning": "x"}
    path = tmp_path / "port.yaml"
    path.write_text(yaml.safe_dump({"switch_prefix": "GLM_", "switches": d}))
    with pytest.raises(SwitchError, match=r"switches \[.*'new'.*\] do not match the plugin's Switches \["):
        read_switches({}, spec=load_spec(path))


@pytest.mark.parametrize(
    "name, value, problem",
    [
        ("GLM_MXK", "true", "'true': a recipe writes '1'"),
        ("GLM_MOE_TP", "02", "'02': a recipe writes '2'"),
        ("GLM_MOE_TP", "0", "0 is below the minimum 1"),
        ("GLM_DSA_SPARSE", "auto", "'auto' is not a boolean (accepted"),
    ],
)
def test_recipe_values_are_checked_and_written_one_way(name, value, problem):
    assert recipe_value_problem(name, _declared()[name], value).startswith(problem)


def test_fixpack_recipe_check_reads_this_ports_switches_with_this_parser():
    from fixpack.pack.pack import Pack
    from fixpack.pack.recipe import switch_problem

    port = Pack(REPO).port("glm-5-mxfp4")
    for name, value in SEED.items():
        assert switch_problem(port, name, value) is None, name
    assert switch_problem(port, "GLM_MOE_TP", "0") == "0 is below the minimum 1"
    assert "is not a boolean" in switch_problem(port, "GLM_ROUTER_FAST", "maybe")
