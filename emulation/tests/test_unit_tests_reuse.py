"""hpu_harness.unit_tests reuses a file's results on the pristine tree only when every input of
that run is unchanged: the tree (profile manifest, vllm-gaudi commit, base, the vLLM beside it),
the file, the emulation's code, the venv, Python, the CPU and the time limits."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("fixpack.proofs.reuse")

from hpu_harness import runtime, unit_tests  # noqa: E402

INFO = {"profile": "v0.26.0", "commit": "b059f9c9", "base": "release", "imports_with": None}
FILE = "tests/unit_tests/test_bucketing.py"


def key(info=INFO, file=FILE, limits=(600, 180)):
    return unit_tests.pristine_key(info, file, limits)


@pytest.mark.parametrize(
    ("change", "part"),
    [
        ({"info": {**INFO, "commit": "091bbadd"}}, "tree"),
        ({"info": {**INFO, "base": "development"}}, "tree"),
        ({"info": {**INFO, "imports_with": "0.27.0"}}, "tree"),
        ({"info": {**INFO, "profile": "v0.30.0"}}, "tree"),  # another manifest
        ({"file": "tests/unit_tests/test_flags.py"}, "tree"),
        ({"limits": (300, 180)}, "options"),
    ],
)
def test_each_input_of_a_pristine_run_is_in_its_key(change, part):
    assert key(**change).changed(key().parts) == [part]


def test_the_emulation_code_and_the_venv_are_in_the_key(tmp_path, monkeypatch):
    base = key()
    copy = tmp_path / "emulation"
    for name in ("hpu_emulation", "hpu_harness"):
        shutil.copytree(runtime.EMULATION_ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(runtime, "EMULATION_ROOT", copy)
    assert key().changed(base.parts) == []  # the same bytes elsewhere: the same key
    with open(copy / "hpu_emulation" / "device.py", "a") as f:
        f.write("\n# changed\n")
    assert key().changed(base.parts) == ["emulation"]

    from fixpack.proofs import reuse

    monkeypatch.setattr(reuse, "distributions_digest", lambda: "another venv")
    assert "venv" in key().changed(base.parts)


def test_a_pristine_run_round_trips_through_the_ledger(tmp_path):
    from fixpack.proofs import reuse

    run = unit_tests.FileRun(FILE, "pristine", {"a::t": "passed", "a::u": "skipped"}, {"a::u": "Skipped: x"}, 3.5)
    ledger = reuse.Ledger("unit-tests-v0.26.0-pristine", root=tmp_path)
    ledger.store(FILE, key(), unit_tests._to_record(run))
    entry, why = ledger.lookup(FILE, key())
    assert entry is not None and unit_tests._from_record(entry["record"]) == run
    assert ledger.lookup(FILE, key(limits=(1, 1)))[0] is None
