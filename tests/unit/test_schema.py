"""fixpack.pack.schema in process: the strict YAML loader and the declared schemas."""

from __future__ import annotations

import pytest

from fixpack.errors import ConfigError
from fixpack.pack.schema import FIX_SCHEMA, check_mapping, check_slug, load_yaml


def test_load_yaml_refuses_a_duplicate_key_at_any_depth_naming_both_lines(tmp_path):
    path = tmp_path / "fix.yaml"
    path.write_text("id: a\ntargets:\n  - package: vllm\n    path: x.py\n    path: y.py\n")
    with pytest.raises(ConfigError) as exc:
        load_yaml(path)
    assert str(exc.value).startswith(f"{path}: invalid YAML: ")
    assert "duplicate key 'path' at line 5 (first at line 4)" in str(exc.value)


def test_load_yaml_constructs_no_python_objects(tmp_path):
    path = tmp_path / "fix.yaml"
    path.write_text("id: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_yaml(path)


def test_load_yaml_reads_plain_data_and_names_an_unreadable_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: v1\nfixes: [a, {id: b, opt_in: true}]\n")
    assert load_yaml(path) == {"name": "v1", "fixes": ["a", {"id": "b", "opt_in": True}]}
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read"):
        load_yaml(tmp_path / "missing.yaml")


def fix(**over):
    data = {
        "id": "a",
        "summary": "s",
        "why": "w",
        "kind": "diff",
        "targets": [],
        "upstream": None,
        "remove_when": "never",
        "tests": ["test_a.py"],
        "releases": {"v1": {"status": "applies"}},
    }
    data.update(over)
    return data


def test_check_mapping_accepts_a_complete_fix_and_returns_it():
    data = fix(notes="n")
    assert check_mapping(data, FIX_SCHEMA, where="f.yaml") is data


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (["a"], "f.yaml: expected a mapping, found list"),
        (fix(colour="red"), "f.yaml: unknown key 'colour' (known: id, summary"),
        ({k: v for k, v in fix().items() if k != "why"}, "f.yaml: missing key 'why' (the defect: what goes wrong"),
        (fix(tests="test_a.py"), "f.yaml: key 'tests' must be list, found str"),
        (fix(upstream=3), "f.yaml: key 'upstream' must be str or dict or null, found int"),
        (fix(cpu_demonstrable="no"), "f.yaml: key 'cpu_demonstrable' must be bool, found str"),
    ],
)
def test_check_mapping_names_the_file_and_the_key(data, says):
    with pytest.raises(ConfigError) as exc:
        check_mapping(data, FIX_SCHEMA, where="f.yaml")
    assert str(exc.value).startswith(says)


def test_a_bool_is_not_an_int():
    schema = {"n": ((int,), True, "a count")}
    assert check_mapping({"n": 3}, schema, where="w") == {"n": 3}
    with pytest.raises(ConfigError, match="key 'n' must be int, found bool"):
        check_mapping({"n": True}, schema, where="w")


@pytest.mark.parametrize("good", ["a", "bad-words-index", "v0.26.0", "x_1", "9"])
def test_check_slug_accepts_ids(good):
    assert check_slug(good, where="w") == good


@pytest.mark.parametrize("bad", ["", "Bad", "-a", ".a", "a/b", "a b", "a" * 64, 7])
def test_check_slug_refuses_others(bad):
    with pytest.raises(ConfigError, match="is not a valid id"):
        check_slug(bad, where="w")
