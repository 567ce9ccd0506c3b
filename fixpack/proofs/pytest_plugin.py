"""pytest plugin for fix tests: ``python -m pytest -p fixpack.proofs.pytest_plugin fixes/<id>``.

Gives the fixture ``tree``: the release tree under test (FIXPACK_TREE), already first on
sys.path with the hardware stubbed.

Registers the marker ``releases("v0.30.0", ...)``: the test runs only when the tree under test
is one of these releases (FIXPACK_RELEASE, set by `fixpack check` from the profile); on any
other release it is deselected, so one test file serves every release of its fix. Without
FIXPACK_RELEASE (a tree given by hand) a marked test runs only if FIXPACK_RELEASE is set to
one of its releases: set it as `fixpack check` does.

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

from fixpack.proofs.release_tree import RELEASE_ENV, tree_from_env, use_tree

REPORT_ENV = "FIXPACK_TEST_REPORT"
_ASSERT_HELPERS = ("/torch/testing/", "/numpy/testing/", "/_pytest/")
_records: dict[str, dict] = {}
_collect_errors: list[dict] = []


@pytest.fixture(scope="session")
def tree():
    return use_tree(tree_from_env())


@pytest.fixture(scope="session")
def release():
    """The release (profile name) the tree under test is, for a test whose set-up differs by
    release; None when FIXPACK_RELEASE is not set."""
    return os.environ.get(RELEASE_ENV) or None


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "releases(*names): run this test only on these releases (profile names; FIXPACK_RELEASE); deselected on the others",
    )
    config.addinivalue_line(
        "markers",
        "red_raises(*names): before the fix this test may fail by raising one of these exceptions (the defect), not only by an assertion",
    )


def releases_of(item) -> set[str] | None:
    """The releases a test is marked for (None: unmarked, every release)."""
    marks = list(item.iter_markers("releases"))
    if not marks:
        return None
    names: set[str] = set()
    for mark in marks:
        names.update(str(a) for a in mark.args)
    return names


def pytest_collection_modifyitems(config, items):
    release = os.environ.get(RELEASE_ENV)
    keep: list = []
    drop: list = []
    for item in items:
        named = releases_of(item)
        (keep if named is None or release in named else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


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
