"""scripts/stages.py, the test command's stages: a stage fails on a non-zero exit, on running past
its bound, when pytest collected nothing or passed nothing, and (under CI=true) when its venv is
missing; one failing stage never stops or hides the next; skips for unavailable release sources
are counted. And the stage list itself: every test file of the repository is run by a stage, and
every test deselected from the suite as slow is run by one (or named here as outside CI)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ci_stages", REPO / "scripts" / "stages.py")
stages = importlib.util.module_from_spec(spec)
sys.modules["ci_stages"] = stages  # dataclasses look their module up by name
spec.loader.exec_module(stages)


@pytest.fixture
def venv(tmp_path):
    """A 'venv' whose python is this interpreter (it has pytest)."""
    bin_ = tmp_path / "venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").symlink_to(sys.executable)
    return str(tmp_path / "venv")


def pytest_stage(venv, tmp_path, body: str, name="s", bound=120) -> stages.Stage:
    test = tmp_path / f"test_{name}.py"
    test.write_text(body)
    return stages.Stage(name, venv, ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)], bound, "a test stage")


def run(st, tmp_path):
    res, _ = stages.run_stage(st, tmp_path, buffered=True)
    return res


def test_a_passing_stage_is_ok_with_its_counts(venv, tmp_path):
    res = run(pytest_stage(venv, tmp_path, "def test_a():\n    pass\ndef test_b():\n    pass\n"), tmp_path)
    assert (res.status, res.rc, res.passed, res.failed, res.skipped) == ("ok", 0, 2, 0, 0)


def test_a_failing_test_fails_the_stage(venv, tmp_path):
    res = run(pytest_stage(venv, tmp_path, "def test_a():\n    assert 0\ndef test_b():\n    pass\n"), tmp_path)
    assert (res.status, res.passed, res.failed) == ("FAILED", 1, 1)


def test_collecting_nothing_fails_the_stage(venv, tmp_path):
    res = run(pytest_stage(venv, tmp_path, "X = 1\n"), tmp_path)
    assert res.status == "FAILED" and res.rc == 5 and "collected no tests" in res.note


def test_a_stage_whose_every_test_skips_fails(venv, tmp_path):
    body = "import pytest\ndef test_a():\n    pytest.skip('SOURCE UNAVAILABLE: vllm-gaudi v0.26.0')\n"
    res = run(pytest_stage(venv, tmp_path, body), tmp_path)
    assert res.status == "FAILED" and res.rc == 0 and "no test passed" in res.note
    assert res.source_skips == {"SOURCE UNAVAILABLE: vllm-gaudi v0.26.0": 1}


def test_a_stage_past_its_bound_is_stopped_and_fails(venv, tmp_path):
    res = run(pytest_stage(venv, tmp_path, "import time\ndef test_a():\n    time.sleep(60)\n", bound=3), tmp_path)
    assert res.status == "FAILED" and "stopped at its bound of 3 s" in res.note and res.seconds < 40


def test_a_missing_venv_fails_under_ci_and_is_not_run_elsewhere(tmp_path, monkeypatch):
    st = stages.Stage("e2e", str(tmp_path / "no-venv"), ["-m", "pytest"], 60, "needs a venv")
    monkeypatch.setenv("CI", "true")
    res = run(st, tmp_path)
    assert res.status == "FAILED" and "no-venv" in res.note
    monkeypatch.delenv("CI")
    assert run(st, tmp_path).status == "NOT RUN"


def test_no_stage_hides_another(venv, tmp_path, monkeypatch, capsys):
    """The first stage fails; the second still runs; the command fails and the table shows both."""
    first = pytest_stage(venv, tmp_path, "def test_a():\n    assert 0\n", name="first")
    second = pytest_stage(venv, tmp_path, "def test_b():\n    pass\n", name="second")
    monkeypatch.setattr(stages, "stages", lambda extra: [first, second])
    monkeypatch.setattr(stages, "OUT", tmp_path / "out")
    assert stages.main([]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^first\s+FAILED\s+0\s+1\s+0", out, re.M), out
    assert re.search(r"^second\s+ok\s+1\s+0\s+0", out, re.M), out
    assert "FAILED stages: first" in out


def test_stages_run_two_at_a_time_and_a_stage_marked_alone_after_them(venv, tmp_path, monkeypatch, capsys):
    """Two 3-second stages side by side take about 3 s, not 6; the stage marked alone starts
    only when both have ended (its test sees their junit reports written)."""
    slow = "import time\ndef test_a():\n    time.sleep(3)\n"
    one, two = (pytest_stage(venv, tmp_path, slow, name=n) for n in ("one", "two"))
    out = tmp_path / "out"
    after = pytest_stage(
        venv,
        tmp_path,
        f"from pathlib import Path\ndef test_c():\n    assert Path({str(out / 'one.xml')!r}).is_file()\n"
        f"    assert Path({str(out / 'two.xml')!r}).is_file()\n",
        name="after",
    )
    after.alone = True
    monkeypatch.setattr(stages, "stages", lambda extra: [after, one, two])
    monkeypatch.setattr(stages, "OUT", out)
    assert stages.main(["--jobs", "2"]) == 0, capsys.readouterr().out
    r = {res.stage: res for res in stages._last_results}
    one_end, two_end = r["one"].started + r["one"].seconds, r["two"].started + r["two"].seconds
    assert r["two"].started < one_end and r["one"].started < two_end  # they overlapped
    assert r["after"].started >= max(one_end, two_end) - 0.2


# ---------------------------------------------------------------- the stage list

# Tests deselected from the suite as slow that no stage runs, each with the command that does.
OUTSIDE_CI = {
    "tests/integration/test_reliability_crash.py": "the reliability campaign's sweeps (docs/reliability.md)",
    "tests/integration/test_reliability_concurrency.py": "the reliability campaign's sweeps (docs/reliability.md)",
    "tests/integration/test_reliability_faults.py": "the reliability campaign's sweeps (docs/reliability.md)",
}


def _paths_of(st) -> list[str]:
    return [a for a in st.argv if a.endswith(".py") or "/" in a and not a.startswith("-")]


def _run_script_paths(script: str) -> list[str]:
    """The test paths a port's tests/e2e/run.sh hands pytest ("$PORT/tests/..." in its text). The
    glm-5-mxfp4 e2e files on vllm-gaudi's runner or the emulated card (test_vllm_gaudi_*,
    test_hpu_*) skip in that script's venv (.venv-cpu030): they count only where a stage names them."""
    port = script.split("/tests/")[0]
    text = (REPO / script).read_text()
    paths = [f"{port}/tests/{m}" for m in re.findall(r'"\$PORT/tests/([^"]+)"', text)]
    if port.endswith("glm-5-mxfp4"):
        e2e = REPO / port / "tests" / "e2e"
        paths = [
            p.relative_to(REPO).as_posix()
            for p in sorted(e2e.glob("test_*.py"))
            if not p.name.startswith(("test_vllm_gaudi_", "test_hpu_"))
        ]
    return paths


def _covered(rel: str, st) -> bool:
    paths = [p for a in _paths_of(st) for p in (_run_script_paths(a) if a.endswith("run.sh") else [a])]
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in paths)


def test_every_test_file_is_run_by_a_stage():
    import tomllib

    testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    all_stages = stages.stages([])
    main = next(st for st in all_stages if st.name == "main-suite")
    ignored = {a.split("=", 1)[1] for a in main.argv if a.startswith("--ignore=")}
    assert ignored == set(stages.RELEASE_CHECKS.values())
    missing = []
    for path in sorted(REPO.glob("**/test_*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith((".venv", "fixes/", "ports/glm-5-3-flash/fixes/", "ports/glm-5-mxfp4/fixes/")) or "/." in rel:
            continue  # fix tests are run by `fixpack check` (the suite's release tests)
        in_main = any(rel.startswith(t + "/") for t in testpaths) and rel not in ignored
        if in_main or any(_covered(rel, st) for st in all_stages):
            continue
        missing.append(rel)
    assert not missing, f"test files no stage runs: {missing}"


SLOW = re.compile(r"^\s*(@pytest\.mark\.|pytestmark = pytest\.mark\.)" + "slow", re.M)


def test_every_slow_test_is_run_by_a_stage_or_named_outside_ci():
    all_stages = stages.stages([])
    slow_stages = [
        st for st in all_stages if any(a in ("slow", "") and st.argv[i - 1] == "-m" for i, a in enumerate(st.argv) if i)
    ]
    slow_stages += [st for st in all_stages if st.shell]  # the run scripts pass -m ""
    missing = []
    for path in sorted(REPO.glob("**/test_*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(".venv") or not SLOW.search(path.read_text()):
            continue
        if rel in OUTSIDE_CI or any(_covered(rel, st) for st in slow_stages):
            continue
        missing.append(rel)
    assert not missing, f"slow tests that no stage runs: {missing}"


def test_every_stage_is_bounded_and_the_bounds_are_named():
    for st in stages.stages([]):
        assert 0 < st.bound <= 3600, st.name
