"""pytest plugin for fix tests: ``python -m pytest -p fixpack.testing.plugin fixes/<id>``.

Gives the fixture ``tree``: the release tree under test (FIXPACK_TREE), already first on
sys.path with the hardware stubbed.

Registers the marker ``red_raises("ExcType", ...)``: on the tree before the fix this test may
fail by raising that exception (the defect itself is the exception, e.g. an IndexError in the
sampler) rather than by a failed assertion. Name the type as a string: pytest takes a marker
whose only argument is a class as decorating that class. `fixpack check` accepts only an
assertion of the test or a declared exception as red.

With FIXPACK_TEST_REPORT=PATH it writes what each test did, phase by phase, as JSON: the
machine-readable report `fixpack check` reads (pytest's own outcomes, plus the exception type
and where it was raised, which its junit XML does not carry).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fixpack.testing import tree_from_env, use_tree

REPORT_ENV = "FIXPACK_TEST_REPORT"
_ASSERT_HELPERS = ("/torch/testing/", "/numpy/testing/", "/_pytest/")
_records: dict[str, dict] = {}
_collect_errors: list[dict] = []


@pytest.fixture(scope="session")
def tree():
    return use_tree(tree_from_env())


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "red_raises(*names): before the fix this test may fail by raising one of these exceptions (the defect), not only by an assertion",
    )


def _first_line(text: str, limit: int = 200) -> str:
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def _declared(item) -> list[str]:
    names = []
    for mark in item.iter_markers("red_raises"):
        for a in mark.args:
            names.append(a if isinstance(a, str) else getattr(a, "__name__", str(a)))
    return names


def _exc_record(item, excinfo) -> dict:
    exc = excinfo.value
    mro = [c.__name__ for c in type(exc).__mro__]
    # Where it was raised: the innermost frame. An AssertionError raised inside the code under
    # test is an exception of that code, not the test's own assertion.
    tb = list(excinfo.traceback)
    entry = tb[-1] if tb else None
    where = f"{Path(str(entry.path)).name}:{entry.lineno + 1}" if entry is not None else ""
    test_file = Path(str(item.path)).resolve()
    in_file = [i for i, e in enumerate(tb) if Path(str(e.path)).resolve() == test_file]
    in_test = bool(in_file) and in_file[-1] == len(tb) - 1
    if not in_test and in_file and isinstance(exc, AssertionError):
        # The test called an assertion helper (torch.testing.assert_close, numpy.testing...):
        # still the test's own assertion.
        called = str(tb[in_file[-1] + 1].path).replace("\\", "/")
        in_test = any(part in called for part in _ASSERT_HELPERS)
    cause = _first_line(getattr(exc, "msg", None) or str(exc)) or type(exc).__name__
    if type(exc).__name__ not in ("AssertionError", "Failed"):
        cause = f"{type(exc).__name__}: {cause}" if cause != type(exc).__name__ else cause
    return {"exc_type": type(exc).__name__, "exc_mro": mro, "raised_in_test": in_test, "where": where, "cause": cause}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rec = _records.setdefault(item.nodeid, {"name": item.name, "declared": _declared(item), "phases": {}})
    phase = {"outcome": rep.outcome}
    if call.excinfo is not None and rep.outcome == "failed":
        phase.update(_exc_record(item, call.excinfo))
    elif rep.outcome == "skipped":
        phase["cause"] = _first_line(rep.longrepr[2] if isinstance(rep.longrepr, tuple) else rep.longrepr)
    rec["phases"][call.when] = phase


def pytest_collectreport(report):
    if report.failed:
        text = str(report.longrepr)
        lines = [line for line in text.splitlines() if line.startswith("E ")]
        _collect_errors.append({"nodeid": report.nodeid, "cause": _first_line(lines[-1][2:] if lines else text)})


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    Path(path).write_text(json.dumps({"exitstatus": int(exitstatus), "tests": _records, "collect_errors": _collect_errors}, indent=1))
