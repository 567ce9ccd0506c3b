"""What `fixpack check` proves about one fix, part by part.

- Red/green per test: each test of the fix runs on the tree before it and after it (one
  pytest process per tree, every test run, none stopped early; outcomes read from the
  plugin's JSON report). Before the fix each must fail by an assertion of the test (or
  pytest.fail) or by an exception its ``red_raises`` marker declares; a failure in
  collection, import or fixture set-up never counts. After it each must pass. A test that
  passes before is allowed only when fix.yaml names it in ``regression_guards``.
- Every part necessary: for a fix of several parts (a diff's hunks, an edit's replacements, a
  codemod's places), the fix is applied with one part left out, and at least one of its
  tests must turn red; otherwise that part is named (nothing tests it, or it is not needed).
  A part that changes only comments or blank lines is reported as such and not run.
- Requirements complete: the fix is applied with only its declared ``requires`` (and theirs)
  to the pristine tree and its tests must pass there; when they do not, the earlier fix that
  makes them pass is named.

The trees here are built with the fix's own change (``apply_change``), not the engine: they
are scratch copies for tests, and the full change is checked to give the engine's bytes.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from fixpack.errors import ConfigError
from fixpack.kinds.base import parse_python
from fixpack.proofs.release_tree import RELEASE_ENV

PKG_PARENT = str(Path(__file__).resolve().parents[2])
_lock = threading.Lock()


# ---------------------------------------------------------------- running a fix's tests


@dataclass
class TestRun:
    rc: int
    seconds: float
    tests: dict = field(default_factory=dict)  # nodeid -> record from the plugin
    collect_errors: list = field(default_factory=list)
    summary: str = ""  # the last line pytest printed, or why there is no report

    @property
    def reported(self) -> bool:
        return bool(self.tests) or bool(self.collect_errors)


# What every fix test imports before it reaches the tree: paid once per test server, not once
# per run (the tree's own vllm / vllm_gaudi are never imported here: use_tree refuses them).
PRELOAD = ("torch", "numpy", "transformers", "tokenizers", "pydantic", "msgspec", "pytest", "fixpack.proofs.pytest_plugin")


class TestServer:
    """One per worker thread of the check: the sandbox's fork server with the test preload
    (fixpack.sandbox.forkserver); `run` has the contract of a fresh interpreter."""

    def __init__(self):
        from fixpack.sandbox import forkserver

        self.server = forkserver.ForkServer(forkserver.server_env(), preload=forkserver.TESTS)

    def run(self, args: list[str], env: dict, cwd: Path, timeout: float) -> tuple[int | None, str]:
        """pytest's exit code (None: killed at ``timeout``) and its output."""
        reply = self.server.run({"tests": {"args": args, "env": env, "cwd": str(cwd)}}, timeout)
        return (None if reply["timed_out"] else reply["rc"]), reply["stdout"]

    def close(self):
        self.server.close()


_idle: list[TestServer] = []
_servers: list[TestServer] = []


def _acquire() -> TestServer | None:
    """An idle test server, or a new one (FIXPACK_TEST_SERVER=0: a fresh interpreter per run)."""
    if os.environ.get("FIXPACK_TEST_SERVER", "1") == "0" or not hasattr(os, "fork"):
        return None
    with _lock:
        if _idle:
            return _idle.pop()  # a server that has died is started again by its next run
    srv = TestServer()
    with _lock:
        _servers.append(srv)
    return srv


def _release(srv: TestServer | None) -> None:
    if srv is not None:
        with _lock:
            _idle.append(srv)


def close_servers() -> None:
    with _lock:
        while _servers:
            _servers.pop().close()
        _idle.clear()


def run_tests(fix, tree: Path, timeout: float, *, stop_at_first_failure: bool = False) -> TestRun:
    """Run the fix's tests on ``tree`` in a fresh process and read the plugin's report."""
    env = dict(os.environ, FIXPACK_TREE=str(tree), PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    # the release the tree is: a test marked releases(...) runs only on the ones it names
    env.pop(RELEASE_ENV, None)
    if getattr(fix, "release", None):
        env[RELEASE_ENV] = fix.release
    env["PYTHONPATH"] = PKG_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="fixpack-report-") as d:
        report = Path(d) / "report.json"
        env["FIXPACK_TEST_REPORT"] = str(report)
        tests = [str(fix.dir / t) for t in fix.meta["tests"]]
        args = ["-q", "-p", "fixpack.proofs.pytest_plugin", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(fix.dir)]
        if stop_at_first_failure:
            args.append("-x")
        t0 = time.perf_counter()
        srv = _acquire()
        from fixpack.sandbox.forkserver import ServerDied  # the server imports this module
        if srv is not None:
            try:
                rc, stdout = srv.run(args + tests, env, fix.dir, timeout)
            except (OSError, ValueError, ServerDied):
                srv.close()
                srv = None  # run it in a fresh interpreter instead
            finally:
                _release(srv)
        if srv is not None:
            stderr = ""
            if rc is None:
                return TestRun(124, time.perf_counter() - t0, summary=f"timed out after {timeout:.0f} s")
        else:
            try:
                proc = subprocess.run([sys.executable, "-m", "pytest", *args, *tests], capture_output=True, text=True, timeout=timeout, env=env, cwd=fix.dir)
            except subprocess.TimeoutExpired:
                return TestRun(124, time.perf_counter() - t0, summary=f"timed out after {timeout:.0f} s")
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        secs = time.perf_counter() - t0
        lines = [line for line in stdout.strip().splitlines() if line.strip()]
        summary = lines[-1] if lines else stderr.strip()[-300:]
        if not report.is_file():
            return TestRun(rc, secs, summary=f"no test report (pytest exit {rc}): {summary}")
        data = json.loads(report.read_text())
    return TestRun(rc, secs, data["tests"], data["collect_errors"], summary)


def _failure(rec: dict) -> tuple[str, dict] | None:
    """(phase, phase record) of the first phase that did not pass or was skipped."""
    for when in ("setup", "call", "teardown"):
        ph = rec["phases"].get(when)
        if ph and ph["outcome"] != "passed":
            return when, ph
    return None


def red_of(rec: dict) -> tuple[bool, str]:
    """Whether a test's run before the fix is an acceptable red, and its one-line cause."""
    fail = _failure(rec)
    if fail is None:
        return False, "passes before the fix"
    when, ph = fail
    if ph["outcome"] == "skipped":
        return False, f"skipped before the fix ({ph.get('cause', '')})"
    if when != "call":
        return False, f"error in {when}, not in the test: {ph.get('cause', '')}"
    declared = rec.get("declared") or []
    if declared and any(name in ph.get("exc_mro", []) for name in declared):
        return True, ph.get("cause", "")
    if ph.get("exc_type") in ("AssertionError", "Failed") and ph.get("raised_in_test"):
        return True, ph.get("cause", "")
    if declared:
        return False, f"raised {ph.get('exc_type')} at {ph.get('where')} ({ph.get('cause', '')}), not the declared {', '.join(declared)}"
    return False, (
        f"raised {ph.get('exc_type')} at {ph.get('where')}, not an assertion of the test ({ph.get('cause', '')}); "
        f"if that exception is the defect, mark the test @pytest.mark.red_raises({ph.get('exc_type')})"
    )


def green_of(rec: dict) -> tuple[bool, str]:
    fail = _failure(rec)
    if fail is None:
        return True, ""
    when, ph = fail
    return False, f"{ph['outcome']} in {when} after the fix: {ph.get('cause', '')}"


def guard_matches(name: str, nodeid: str, test_name: str) -> bool:
    """A regression_guards entry names a test function (every parametrization), one
    parametrization (``test_x[a]``), or ``file.py::test_x``."""
    base = test_name.split("[", 1)[0]
    return name in (test_name, base) or nodeid.endswith("::" + name) or nodeid == name or nodeid.split("[", 1)[0] == name


class RedGreen(TypedDict):
    """What `red_green` finds: a row per test (test, role, ok, cause[, red, green]), the counts."""

    tests: list[dict[str, Any]]
    red_green: int
    guards: int
    problems: list[str]


def red_green(fix, before: TestRun, after: TestRun) -> RedGreen:
    """The per-test verdicts of one fix; ``problems`` is empty when its proof holds."""
    guards = list(fix.meta.get("regression_guards") or [])
    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    for run, label in ((before, "before"), (after, "after")):
        if not run.reported:
            problems.append(f"{label}: {run.summary}")
        for err in run.collect_errors:
            problems.append(f"{label}: collection error in {err['nodeid'] or 'the test file'}: {err['cause']}")
    used = set()
    for nodeid in list(after.tests) + [n for n in before.tests if n not in after.tests]:
        b, a = before.tests.get(nodeid), after.tests.get(nodeid)
        rec = b or a
        assert rec is not None  # nodeid comes from one of the two runs
        guard = [g for g in guards if guard_matches(g, nodeid, rec["name"])]
        used.update(guard)
        row: dict[str, Any] = {"test": nodeid.split("::", 1)[-1], "role": "guard" if guard else "red-green"}
        if b is None or a is None:
            row.update(ok=False, cause=f"not run {'before' if b is None else 'after'} the fix")
        else:
            green, gcause = green_of(a)
            if guard:
                red = _failure(b) is not None
                ok = green and not red
                cause = gcause or ("declared a regression guard but fails before the fix: " + red_of(b)[1] if red else "passes before and after (regression guard)")
            else:
                red, cause = red_of(b)
                ok = red and green
                if red and not green:
                    cause = gcause
            row.update(ok=ok, cause=cause, red=not guard and red_of(b)[0], green=green)
        if not row["ok"]:
            problems.append(f"{row['test']}: {row['cause']}")
        rows.append(row)
    for g in guards:
        if g not in used:
            problems.append(f"{fix.dir / 'fix.yaml'}: regression_guards names {g!r}, which is no test of the fix")
    if not rows and not problems:
        problems.append("no test ran")
    n_red = sum(1 for r in rows if r["role"] == "red-green" and r["ok"])
    n_guard = sum(1 for r in rows if r["role"] == "guard" and r["ok"])
    return {"tests": rows, "red_green": n_red, "guards": n_guard, "problems": problems}


# ---------------------------------------------------------------- building trees


def snapshot(tree: Path, dest: Path) -> Path:
    """A hard-linked copy: files are only ever replaced by rename, so nothing writes through."""

    def link(src, dst):
        os.link(src, dst)
        return dst

    shutil.copytree(tree, dest, copy_function=link, ignore=shutil.ignore_patterns(".fixpack", "__pycache__"))
    return dest


def replace_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".fixpack-new")
    tmp.write_bytes(data)
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
    os.replace(tmp, path)  # never write into: the file may be a hard link to the read-only cache


@dataclass
class Part:
    """One hunk of a diff, one replacement of an edit, or one place of a codemod."""

    index: int
    label: str


def apply_change(fix, tree: Path, drop: int | None = None) -> tuple[dict[str, bytes], list[Part]]:
    """The fix's new target bytes on ``tree`` (left as it is) and its parts; ``drop``: the
    index of one part to leave out."""
    from fixpack import kinds

    sources = {t.rel: (tree / t.rel).read_bytes() for t in fix.targets}
    applied = kinds.module(fix.kind).apply(fix.change_dir, sources, drop)
    out = {rel: data for rel, data in applied.outputs.items() if data != sources[rel]}
    return out, [Part(i, label) for i, label in enumerate(applied.parts)]


def build_tree(base: Path, dest: Path, fixes: list, drop: tuple[str, int] | None = None) -> Path:
    """``base`` (hard-linked) with ``fixes`` applied in order; ``drop``: (fix id, part index)."""
    snapshot(base, dest)
    for fix in fixes:
        changes, _ = apply_change(fix, dest, drop[1] if drop and drop[0] == fix.id else None)
        for rel, data in changes.items():
            replace_file(dest / rel, data)
    return dest


def same_code(a: bytes, b: bytes) -> bool:
    """Equal but for comments and blank lines (equal syntax trees)."""
    try:
        return ast.dump(parse_python(a)) == ast.dump(parse_python(b))
    except SyntaxError:
        return False


def requires_closure(fix, by_id: dict) -> set[str]:
    out: set[str] = set()
    todo = list(fix.requires)
    while todo:
        r = todo.pop()
        if r in out:
            continue
        if r not in by_id:
            raise ConfigError(f"{fix.dir / 'fix.yaml'}: requires {r!r}, which is not in this selection")
        out.add(r)
        todo += by_id[r].requires
    return out
