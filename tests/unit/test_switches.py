"""fixpack.pack.switches: the one parser of every port's port.yaml switches (the ports' own tests in
ports/*/tests check their declarations through it)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fixpack.pack import switches as sw

REPO = Path(__file__).resolve().parents[2]


def decl(**entry):
    return {"type": "bool", "default": 1, "reference": 0, "meaning": "m", **entry}


@dataclass(frozen=True)
class Record:
    flag: bool | None
    count: int
    mode: str
    file: str | None
    label: str


SPEC = {
    "P_FLAG": decl(default="auto"),
    "P_COUNT": decl(type="int", default=4, reference=1, min=1, max=8),
    "P_MODE": decl(type="enum", default="fast", reference="exact", choices=["fast", "exact"]),
    "P_FILE": decl(type="path", default="none", reference="none"),
    "P_LABEL": decl(type="str", default="x", reference="x"),
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "port.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_port_yaml_gives_typed_values_for_every_type(tmp_path):
    spec = sw.load_spec(write(tmp_path, {"switch_prefix": "P_", "switches": SPEC}))
    assert list(spec) == list(SPEC) and spec.prefix == "P_" and spec.field_name("P_COUNT") == "count"
    assert sw.read_into(Record, spec, {}) == Record(None, 4, "fast", None, "x")
    env = {"P_FLAG": " Off ", "P_COUNT": "8", "P_MODE": "exact", "P_FILE": "/a b/p.json", "P_LABEL": "y"}
    assert sw.read_into(Record, spec, env) == Record(False, 8, "exact", "/a b/p.json", "y")
    assert sw.reference_into(Record, spec) == Record(False, 1, "exact", None, "x")
    assert [s.reference_text for s in spec.values()] == ["0", "1", "exact", "none", "x"]


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "P_FLAG",
            "maybe",
            "P_FLAG='maybe': 'maybe' is not a boolean (accepted: 1/0, true/false, yes/no, on/off in any case, or auto)",
        ),
        ("P_COUNT", "9", "P_COUNT='9': 9 is above the maximum 8"),
        ("P_COUNT", "0", "P_COUNT='0': 0 is below the minimum 1"),
        ("P_COUNT", "4.0", "P_COUNT='4.0': '4.0' is not an integer"),
        ("P_MODE", "Fast", "P_MODE='Fast': 'Fast' is not one of fast, exact"),
        ("P_FILE", "a\0b", "P_FILE='a\\x00b': a path cannot hold a NUL character"),
    ],
)
def test_a_bad_env_value_names_the_variable_and_the_value(name, value, message):
    spec = sw.parse_spec(SPEC, where="x/port.yaml", prefix="P_")
    with pytest.raises(sw.SwitchError) as info:
        sw.read_into(Record, spec, {name: value})
    assert str(info.value) == message


def test_a_switch_the_plugin_does_not_read_is_refused(tmp_path):
    path = write(tmp_path, {"switch_prefix": "P_", "switches": {**SPEC, "P_NEW": decl()}})
    with pytest.raises(sw.SwitchError) as info:
        sw.read_into(Record, sw.load_spec(path), {})
    assert str(info.value).startswith(f"{path}: switches [") and "'new'" in str(info.value)
    assert "do not match the plugin's Record ['count', 'file', 'flag', 'label', 'mode']" in str(info.value)


@pytest.mark.parametrize(
    "data, message",
    [
        ("just text", "not a mapping"),
        ({"switch_prefix": "P_"}, "'switches' must be a non-empty mapping of NAME: declaration"),
        ({"switches": SPEC}, "key 'switch_prefix' is missing"),
        ({"switch_prefix": "p_", "switches": SPEC}, "switch_prefix 'p_': upper-case words ending in '_'"),
        (
            {"switch_prefix": "P_", "switches": {"P_X": 1}},
            "switches.P_X: must be a mapping with keys type, default, reference, meaning",
        ),
        ({"switch_prefix": "P_", "switches": {"P_X": decl(type="enum")}}, "switches.P_X: type enum needs 'choices'"),
        (
            {"switch_prefix": "P_", "switches": {"P_X": decl(choices=["a"])}},
            "switches.P_X: 'choices' apply to type enum only",
        ),
        (
            {
                "switch_prefix": "P_",
                "switches": {"P_X": decl(type="enum", default="a", reference="a", choices=["a", "a"])},
            },
            "switches.P_X: 'choices' must be a non-empty list of distinct values",
        ),
        (
            {"switch_prefix": "P_", "switches": {"P_X": decl(type="int", default=1, reference=1, min="1")}},
            "switches.P_X: min '1' is not an integer",
        ),
        (
            {"switch_prefix": "P_", "switches": {"P_X": decl(type="path", default="/f", reference="none")}},
            "switches.P_X: a path switch's default must be none",
        ),
        (
            {"switch_prefix": "P_", "switches": {"P_X": decl(reference="auto", default="auto")}},
            "switches.P_X: reference must be 0 or 1, not auto",
        ),
        ({"switch_prefix": "P_", "switches": {"P_X": decl(meaning="  ")}}, "switches.P_X: 'meaning' is empty"),
        (
            {"switch_prefix": "P_", "switches": {"Q_X": decl()}},
            "switches.Q_X: a switch name is upper case (A-Z, 0-9, _) and starts with P_",
        ),
    ],
)
def test_a_bad_port_yaml_names_the_file_and_the_switch(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(sw.SwitchError) as info:
        sw.load_spec(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)


def test_an_unreadable_port_yaml_is_a_switch_error(tmp_path):
    path = tmp_path / "port.yaml"
    path.write_text("switches: [unclosed\n")
    with pytest.raises(sw.SwitchError, match=f"{path}: cannot read the switches"):
        sw.load_spec(path)
    with pytest.raises(sw.SwitchError, match="cannot read the switches"):
        sw.load_spec(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    "name, value, problem",
    [
        ("P_FLAG", "1", None),
        ("P_FLAG", "auto", None),
        ("P_FLAG", "on", "'on': a recipe writes '1'"),
        ("P_COUNT", "08", "'08': a recipe writes '8'"),
        ("P_MODE", "exact", None),
        ("P_FILE", "none", None),
        ("P_FILE", " p.json", "' p.json' has leading or trailing blanks"),
        ("P_LABEL", "", "the value is empty"),
    ],
)
def test_recipe_values_are_values_the_plugin_accepts_written_one_way(name, value, problem):
    assert sw.recipe_value_problem(name, SPEC[name], value, prefix="P_") == problem


def test_the_repository_ports_declare_their_switches_in_the_one_schema():
    for port in ("glm-5-3-flash", "glm-5-mxfp4"):
        spec = sw.load_spec(REPO / "ports" / port / "port.yaml")
        assert spec and all(s.meaning and s.kind in sw.TYPES for s in spec.values()), port


def test_find_port_yaml_beside_the_package_inside_it_or_under_cookbook(tmp_path, monkeypatch):
    monkeypatch.delenv("COOKBOOK", raising=False)
    module = tmp_path / "site" / "pkg" / "switches.py"
    module.parent.mkdir(parents=True)
    module.write_text("")
    with pytest.raises(sw.SwitchError, match="port.yaml of port p, which declares its switches, was not found"):
        sw.find_port_yaml(module, "p")
    cookbook = tmp_path / "cookbook" / "ports" / "p"
    cookbook.mkdir(parents=True)
    (cookbook / "port.yaml").write_text("{}")
    monkeypatch.setenv("COOKBOOK", str(tmp_path / "cookbook"))
    assert sw.find_port_yaml(module, "p") == cookbook / "port.yaml"
    (module.parent / "port.yaml").write_text("{}")  # installed as package data
    assert sw.find_port_yaml(module, "p") == module.parent / "port.yaml"
    (module.parent.parent / "port.yaml").write_text("{}")  # a checkout: beside the package
    assert sw.find_port_yaml(module, "p") == module.parent.parent / "port.yaml"


def test_the_parser_imports_without_yaml_or_the_rest_of_fixpack():
    """A port's plugin imports it in every vLLM process."""
    code = (
        "import sys, fixpack.pack.switches; "
        "print(sorted(m for m in sys.modules if m.startswith(('fixpack.', 'yaml', 'libcst', 'git', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    # fixpack.pack is the package's __init__, which imports nothing
    assert out.strip() == "['fixpack.pack', 'fixpack.pack.switches']"
