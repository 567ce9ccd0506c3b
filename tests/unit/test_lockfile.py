"""fixpack.pack.lockfile in process: loading the lock, selections, the pinned states of a file."""

from __future__ import annotations

import json

import pytest

from fixpack.errors import ConfigError
from fixpack.pack.lockfile import LOCK_FORMAT, Lock, selection_key

P0, P1, P2, P3 = ("0" * 64, "1" * 64, "2" * 64, "3" * 64)
DATA = {
    "format": LOCK_FORMAT,
    "pristine": {"pkg/a.py": P0},
    "selections": [
        {"key": "-|", "port": None, "opt_in": [], "steps": [{"fix": "one", "files": {"pkg/a.py": [P0, P1]}}]},
        {
            "key": "-|opt",
            "port": None,
            "opt_in": ["opt"],
            "steps": [
                {"fix": "one", "files": {"pkg/a.py": [P0, P1]}},
                {"fix": "opt", "files": {"pkg/a.py": [P1, P2], "pkg/b.py": [P0, P3]}},
            ],
        },
    ],
}


def write(tmp_path, data) -> Lock:
    path = tmp_path / "v1.lock.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return Lock.load(path)


@pytest.mark.parametrize(
    ("port", "opt_ins", "key"),
    [(None, [], "-|"), (None, ["a", "b"], "-|a+b"), ("glm", [], "glm|"), ("glm", ["a"], "glm|a")],
)
def test_selection_key(port, opt_ins, key):
    assert selection_key(port, opt_ins) == key


def test_selection_finds_a_pinned_key_and_names_the_others_when_not(tmp_path):
    lock = write(tmp_path, DATA)
    assert lock.selection("-|opt")["opt_in"] == ["opt"]
    with pytest.raises(ConfigError) as exc:
        lock.selection("glm|")
    assert "selection 'glm|' is not pinned (pinned: -|, -|opt); run `fixpack lock`" in str(exc.value)


def test_known_states_names_each_pinned_hash_of_a_file_once(tmp_path):
    lock = write(tmp_path, DATA)
    assert lock.known_states("pkg/a.py") == {
        P0: "pristine",
        P1: "after one (selection -|)",
        P2: "after opt (selection -|opt)",
    }
    assert lock.known_states("pkg/b.py") == {P3: "after opt (selection -|opt)"}
    assert lock.known_states("pkg/none.py") == {}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no lock; generate it with `fixpack lock --profile v1`"),
        ("{oops", "not valid JSON"),
        (json.dumps({"format": 999}), "unknown lock format"),
        (json.dumps([1]), "unknown lock format"),
    ],
)
def test_load_refuses_a_missing_or_unreadable_lock_saying_what_to_run(tmp_path, content, says):
    path = tmp_path / "v1.lock.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as exc:
        Lock.load(path)
    assert str(exc.value).startswith(f"{path}: ") and says in str(exc.value)
