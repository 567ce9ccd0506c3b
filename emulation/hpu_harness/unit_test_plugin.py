"""The pytest plugin with which ``hpu_harness.unit_tests`` runs vllm-gaudi's ``tests/unit_tests``.

Loaded with ``-p hpu_harness.unit_test_plugin``; upstream's files are never edited. It

1. turns a test that needs a model from the Hugging Face Hub into a skip saying so: the runs are
   offline (``HF_HUB_OFFLINE=1``), so such a test stops in huggingface_hub's offline error (or
   transformers' "couldn't connect" one) and is reported as ``skipped: downloads a model ...``;
2. turns a test that stops in :class:`hpu_emulation.errors.NotEmulated` (a Habana API the emulation
   does not provide) into a skip with that message;
3. skips, before they run, the tests of :data:`NOT_EMULATED` (what the emulation cannot provide
   and would not stop cleanly on: a custom TPC kernel library, several cards), with the reason;
4. gives each test a time limit (``HPU_UT_TEST_TIMEOUT`` seconds, SIGALRM): a test past it fails
   with :class:`TestTimeout`, the file's run goes on;
5. writes one JSON line per test outcome to ``HPU_UT_REPORT`` as it goes, so a file whose process
   is killed at the file's time limit still reports the tests it finished.

Only failures are ever reclassified, and only on those two exception families; a skip is never
turned into anything else and a pass is never touched.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

# nodeid prefix (relative to the extracted tests/unit_tests folder's parent) -> reason.
# Each entry names a thing a CPU emulation cannot be: checked by reading the test, not guessed.
NOT_EMULATED: dict[str, str] = {}


class TestTimeout(Exception):
    """The test ran past HPU_UT_TEST_TIMEOUT seconds."""


_DOWNLOAD_MARKERS = (
    "offline mode",
    "HF_HUB_OFFLINE",
    "couldn't connect to 'https://huggingface.co'",
    "We couldn't connect to",
    "outgoing traffic has been disabled",
    "Cannot find an appropriate cached snapshot",
    "LocalEntryNotFoundError",
    # vLLM's ModelConfig when a Hub id is neither cached nor reachable
    "Invalid repository ID or local directory specified",
)


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def classify(exc: BaseException | None) -> str | None:
    """The skip reason for a failure that is a download or a thing not emulated, else None."""
    for e in _chain(exc):
        names = {c.__name__ for c in type(e).__mro__}
        text = f"{type(e).__name__}: {e}"
        if "NotEmulated" in names:
            return f"not emulated: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        if names & {"LocalEntryNotFoundError", "OfflineModeIsEnabled"} or any(m in text for m in _DOWNLOAD_MARKERS):
            lines = text.splitlines() or [type(e).__name__]
            line = next((ln for ln in lines if any(m in ln for m in _DOWNLOAD_MARKERS)), lines[0])
            return f"downloads a model from the Hugging Face Hub (the run is offline): {line.strip()[:160]}"
    return None


def _record(item_nodeid: str, when: str, outcome: str, duration: float, detail: str = "") -> None:
    path = os.environ.get("HPU_UT_REPORT")
    if not path:
        return
    with open(path, "a") as f:
        f.write(
            json.dumps(
                {
                    "nodeid": item_nodeid,
                    "when": when,
                    "outcome": outcome,
                    "duration": round(duration, 3),
                    "detail": detail[:400],
                }
            )
            + "\n"
        )


def pytest_collection_modifyitems(config, items):
    for item in items:
        for prefix, reason in NOT_EMULATED.items():
            if item.nodeid.startswith(prefix) or item.nodeid.startswith("tests/unit_tests/" + prefix):
                item.add_marker(pytest.mark.skip(reason=f"cannot be emulated: {reason}"))
                break


def _on_alarm(signum, frame):
    raise TestTimeout(f"test ran past HPU_UT_TEST_TIMEOUT={os.environ.get('HPU_UT_TEST_TIMEOUT')}s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = int(os.environ.get("HPU_UT_TEST_TIMEOUT", "0") or 0)
    old = None
    if limit > 0:
        old = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(limit)
    try:
        yield
    finally:
        if limit > 0:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        reason = classify(call.excinfo.value)
        if reason is not None:
            report.outcome = "skipped"
            # the form pytest's terminal and junit writers expect of a skip
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
            report.hpu_reclassified = reason


def pytest_runtest_logstart(nodeid, location):
    # a test that starts and never reports took its process down (or ran past the file's limit)
    _record(nodeid, "start", "started", 0.0)


def pytest_runtest_logreport(report):
    # one line per test: a failed/errored setup or teardown, a skipped setup, or the call
    if report.when == "call" or report.outcome != "passed":
        if report.when != "call" and report.outcome == "failed":
            outcome = "error"
        else:
            outcome = report.outcome
        detail = ""
        if hasattr(report, "wasxfail"):  # an expected failure: counted with the skips, said so
            detail = f"xfailed (upstream marks it expected to fail): {report.wasxfail}"
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            detail = str(report.longrepr[2])
        elif report.outcome == "failed":
            text = getattr(report, "longreprtext", "") or ""
            lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
            detail = lines[0] if lines else text.strip().splitlines()[-1] if text.strip() else ""
        _record(report.nodeid, report.when, outcome, report.duration, detail)


def pytest_sessionstart(session):
    os.environ.setdefault("HPU_UT_STARTED", str(time.time()))
