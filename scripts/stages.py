"""The test command's stages (scripts/test.sh runs this with .venv's Python).

Each stage runs in its venv under a time bound; its exit code, its tests passed / failed /
skipped (from pytest's junit XML), its seconds and its slowest tests (``--durations``) are kept,
and one stage's failure never hides another's: every stage runs, a table of all of them is
printed at the end, and the command fails when any stage failed.

A stage fails when its command exits non-zero, when it runs past its bound, when pytest
collected nothing (exit 5) or passed nothing (every test skipped), and, under ``CI=true``, when
its venv is missing. Skips whose reason says a release source cannot be had ("SOURCE
UNAVAILABLE", "sources unavailable", ...) are counted in a second table by reason: those checks
were left out, and CI says how many.

Why plain Python and not nox: the venvs are the README's set-up (scripts/setup.sh, uv), made
once and shared by several stages; nox would make its own per session (or run with
``venv_backend="none"``, where it adds nothing but a dependency), and the table, the strictness
rules and the source counts below would still be this file.

    .venv/bin/python scripts/stages.py [--only NAME ...] [--list] [-- EXTRA PYTEST ARGS for main-suite]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / ".fixpack-work" / "ci"
DURATIONS = "--durations=25"
# pytest dumps every thread's stack for a test past 10 minutes, naming where a hang sits
FAULT = ["-o", "faulthandler_timeout=600"]
SOURCE_SKIP = re.compile(
    r"SOURCES? UNAVAILABLE|sources? (are |is )?unavailable|not in the source cache|RELEASE CHECK SKIPPED", re.I
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class Stage:
    name: str
    venv: str
    argv: list[str]  # after the interpreter, or a shell command when ``shell``
    bound: int  # seconds
    what: str
    pytest: bool = True  # reads its junit XML and adds --junitxml / --durations
    shell: bool = False  # argv[0] is a script run with bash (it passes "$@" to pytest)
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    alone: bool = False  # runs by itself after the others (it needs the machine: TP 4 and 8 as processes)
    long: bool = False  # a long check with its own command (--only NAME), not in the default run: CI's time
    json_counts: bool = False  # the command writes --json FILE with counts (hpu_harness.unit_tests)


#: the release checks (``fixpack check`` of a whole profile: every fix proven from nothing when its
#: inputs changed), each a stage of its own so the pool can place the longest first and a slow
#: proof cannot take the rest of the main suite past its bound
RELEASE_CHECKS = {
    "release-v0.26.0": "tests/release/test_real_release.py",
    "release-v0.30.0": "tests/release/test_release_v030.py",
}


def pytest_args(*paths: str, markers: str | None = None) -> list[str]:
    """pytest's arguments for a stage: quiet, skip reasons shown, no cache; ``markers`` replaces
    the suite's ``-m 'not slow'`` ("" runs every test of the files named)."""
    return [
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        *(["-m", markers] if markers is not None else []),
        *paths,
    ]


def stages(extra: list[str]) -> list[Stage]:
    py_cpu = ".venv-cpu"
    e2e_env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    mx = "ports/glm-5-mxfp4/tests"
    fixpack_python = {"FIXPACK_PYTHON": str(REPO / ".venv" / "bin" / "python")}
    listed = [
        Stage(
            "main-suite",
            ".venv",
            ["-m", "pytest", "-p", "no:cacheprovider", *[f"--ignore={f}" for f in RELEASE_CHECKS.values()], *extra],
            2400,
            "the engine, the pack, both ports' models (testpaths of pyproject.toml, less the release checks)",
        ),
        Stage(
            "release-v0.26.0",
            ".venv",
            pytest_args(RELEASE_CHECKS["release-v0.26.0"]),
            3000,
            "every fix of v0.26.0 and the Flash port's patches proven red/green against the release sources; "
            "its lock, manifest and rebase report",
        ),
        Stage(
            "release-v0.30.0",
            ".venv",
            pytest_args(RELEASE_CHECKS["release-v0.30.0"]),
            3000,
            "every fix of v0.30.0 and glm-5-mxfp4's patches checked against its sources (release or development base)",
        ),
        Stage(
            "emulation",
            py_cpu,
            pytest_args(*FAULT, "--ignore-glob=emulation/tests/test_cost_*.py", "emulation/tests"),
            2400,
            "the Habana emulation and vllm-gaudi's runner on it (Llama, DeepSeek-V2, Qwen3-Next, TP 2, the OpenAI server)",
        ),
        Stage(
            "cost-model",
            py_cpu,
            pytest_args(
                *FAULT,
                "emulation/tests/test_cost_model.py",
                "emulation/tests/test_cost_flash_floors.py",
                "emulation/tests/test_cost_glm53.py",
            ),
            1200,
            "the Gaudi time and memory model (predictions, not measurements): its unit rules, both ports at the "
            "recipes' real shapes on meta tensors, the Flash recipe against the serving page's floors",
        ),
        Stage(
            "cost-plan",
            py_cpu,
            pytest_args(*FAULT, "emulation/tests/test_cost_plan_check.py"),
            2400,
            "python -m hpu_emulation.plan --check on every recipe (PREDICTIONS: memory per card, the Flash floors)",
            long=True,
        ),
        Stage(
            "unit-tests-v0.26.0",
            py_cpu,
            ["-m", "hpu_harness.unit_tests", "--json", "{json}"],
            1800,
            "vllm-gaudi's own unit tests (CI selection) on the emulation, pristine vs patched v0.26.0",
            pytest=False,
            cwd="emulation",
            env=fixpack_python,
            json_counts=True,
        ),
        Stage(
            "unit-tests-v0.30.0",
            py_cpu,
            ["-m", "hpu_harness.unit_tests", "--profile", "v0.30.0", "--json", "{json}"],
            1800,
            "the same on profile v0.30.0's development base (vllm-gaudi 091bbad beside vLLM 0.27.0)",
            pytest=False,
            cwd="emulation",
            env=fixpack_python,
            json_counts=True,
        ),
        Stage(
            "tf514",
            ".venv-tf514",
            pytest_args("ports/glm-5-3-flash/tests/test_hf_config_tf514.py"),
            300,
            "the Flash port's config classes under the stock image's transformers 5.14.1",
        ),
        Stage(
            "slow-kernels",
            ".venv",
            pytest_args(
                "ports/glm-5-3-flash/tests/test_kda_kernels.py",
                "ports/glm-5-3-flash/tests/test_model.py",
                markers="slow",
            ),
            1200,
            "the Flash port's long kernel and decode checks (16K adversarial KDA, left-padded greedy decode)",
        ),
        Stage(
            "flash-e2e",
            py_cpu,
            ["ports/glm-5-3-flash/tests/e2e/run.sh", *FAULT],
            2400,
            "GLM-5.3-Flash end to end: vLLM 0.26.0 on CPU, and vllm-gaudi's runner on the emulation",
            shell=True,
        ),
        Stage(
            "mxfp4-e2e",
            ".venv-cpu030",
            ["ports/glm-5-mxfp4/tests/e2e/run.sh", *FAULT, f"{mx}/test_glm5_hpu_memory_plan.py"],
            1800,
            "glm-5-mxfp4 in vLLM 0.30.0 on CPU, and its KV page against vLLM 0.30.0's MLA spec",
            shell=True,
        ),
        Stage(
            "mxfp4-runner",
            py_cpu,
            pytest_args(
                f"{mx}/e2e/test_vllm_gaudi_emulation.py",
                f"{mx}/e2e/test_vllm_gaudi_dsa.py",
                f"{mx}/e2e/test_vllm_gaudi_mtp_levers.py",
                f"{mx}/e2e/test_vllm_gaudi_structured.py",
                f"{mx}/e2e/test_vllm_gaudi_openai_server.py",
                *FAULT,
                markers="",
            ),
            3000,
            "glm-5-mxfp4 through vllm-gaudi's runner on the emulation (development base): runner, DSA, MTP levers, "
            "structured output, the OpenAI server",
            env=e2e_env,
        ),
        Stage(
            "mxfp4-moe-tp",
            py_cpu,
            pytest_args(f"{mx}/e2e/test_vllm_gaudi_moe_tp.py", *FAULT, markers=""),
            1800,
            "GLM_MOE_TP's expert groups, GLM_MOE_PLACEMENT and the serving page's launch at TP 4 and TP 8 (worker processes as ranks)",
            env=e2e_env,
            alone=True,
            long=True,
        ),
        Stage(
            "mxfp4-hpu-ops",
            py_cpu,
            pytest_args(f"{mx}/e2e/test_hpu_mxk_op.py", f"{mx}/e2e/test_hpu_spec_device.py", *FAULT, markers=""),
            600,
            "the port's ops on the emulated card, the emulation active in the test process",
            env={**e2e_env, "HPU_EMULATION_IN_PROCESS": "1"},
        ),
    ]
    # the pool takes them longest first (measured), so the last to start is a short one
    first = [
        "release-v0.26.0",
        "mxfp4-runner",
        "main-suite",
        "flash-e2e",
        "release-v0.30.0",
        "emulation",
        "unit-tests-v0.26.0",
        "unit-tests-v0.30.0",
    ]
    return sorted(listed, key=lambda st: first.index(st.name) if st.name in first else len(first))


@dataclass
class Result:
    stage: str
    status: str  # ok, FAILED, NOT RUN
    rc: int | None
    seconds: float
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    note: str = ""
    started: float = 0.0  # time.monotonic() at its start
    source_skips: dict[str, int] = field(default_factory=dict)
    slowest: list[tuple[float, str]] = field(default_factory=list)


def junit_counts(path: Path) -> tuple[int, int, int, dict[str, int], list[tuple[float, str]]]:
    """passed, failed (failures and errors), skipped, source-skip reasons, the slowest tests."""
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    reasons: dict[str, int] = {}
    times: list[tuple[float, str]] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        times.append((float(case.get("time") or 0), name))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif (sk := case.find("skipped")) is not None:
            skipped += 1
            msg = (sk.get("message") or "").strip()
            if SOURCE_SKIP.search(msg):
                key = re.sub(r"\s+", " ", msg)[:120]
                reasons[key] = reasons.get(key, 0) + 1
        else:
            passed += 1
    # collection errors are <testcase> entries with <error> too
    return passed, failed, skipped, reasons, sorted(times, reverse=True)[:10]


def _stream(proc: subprocess.Popen, sink) -> None:
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, b""):
        sink.write(line.decode(errors="replace"))
        sink.flush()


def run_stage(st: Stage, out: Path, buffered: bool) -> tuple[Result, str]:
    """Run one stage; (its result, its output when ``buffered``, else "" as it went to stdout)."""
    python = REPO / st.venv / "bin" / "python"
    if not python.is_file():
        why = f"no {st.venv} (make it with scripts/setup.sh)"
        return Result(st.name, "FAILED" if in_ci() else "NOT RUN", None, 0.0, note=why), ""
    xml = out / f"{st.name}.xml"
    js = out / f"{st.name}.json"
    for f in (xml, js):
        f.unlink(missing_ok=True)
    argv = [a.replace("{json}", str(js)) for a in st.argv]
    if st.pytest:
        argv += [f"--junitxml={xml}", DURATIONS]
    cmd = ["bash", *argv] if st.shell else [str(python), *argv]
    env = dict(os.environ, **st.env)
    if st.shell:
        env["PYTHON"] = str(python)  # the run scripts' interpreter (scripts/port-e2e.sh)
    else:
        env.pop("PYTHON", None)
    sink = tempfile.TemporaryFile(mode="w+") if buffered else sys.stdout
    if buffered:  # its output comes whole at its end; say now that it started
        print(f"== stage {st.name} started ({st.venv}, bound {st.bound} s)", flush=True)
    print(f"\n== stage {st.name} ({st.venv}, bound {st.bound} s): {st.what}", file=sink, flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO / st.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    reader = threading.Thread(target=_stream, args=(proc, sink), daemon=True)
    reader.start()
    timed_out = False
    try:
        rc = proc.wait(timeout=st.bound)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    reader.join(timeout=30)
    secs = time.monotonic() - t0
    res = Result(st.name, "ok", rc, round(secs, 1), started=t0)
    notes = []
    if xml.is_file():
        res.passed, res.failed, res.skipped, res.source_skips, res.slowest = junit_counts(xml)
    elif st.json_counts and js.is_file():
        data = json.loads(js.read_text())
        for per_tree in data.get("files", {}).values():
            for tree in per_tree.values():
                res.passed += tree["counts"].get("passed", 0)
                res.failed += tree["counts"].get("failed", 0) + tree["counts"].get("error", 0)
                res.skipped += tree["counts"].get("skipped", 0)
        notes.append(
            f"pristine-pass/fixed-fail {len(data.get('pristine_pass_fixed_not', []))}, unexplained {data.get('unexplained')}"
        )
    if timed_out:
        notes.append(f"stopped at its bound of {st.bound} s")
    if rc == 5:
        notes.append("pytest collected no tests")
    elif (st.pytest or st.json_counts) and not timed_out and res.passed == 0:
        notes.append("no test passed (all skipped, or no report)")
    if timed_out or rc != 0 or (st.pytest or st.json_counts) and res.passed == 0:
        res.status = "FAILED"
    res.note = "; ".join(notes)
    text = ""
    if buffered:
        assert sink is not sys.stdout
        sink.seek(0)
        text = sink.read()
        sink.close()
    return res, text


def _pool(chosen: list[Stage], jobs: int) -> list[Result]:
    """Run ``chosen`` ``jobs`` at a time, in the given order (longest first), each stage's output
    kept and printed whole when it ends; then the stages that must run alone, one by one."""
    shared = [st for st in chosen if not st.alone]
    results: dict[str, Result] = {}
    lock = threading.Lock()
    queue = list(shared)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                st = queue.pop(0)
            res, text = run_stage(st, OUT, buffered=jobs > 1)
            with lock:
                results[st.name] = res
                print(text, end="", flush=True)
                print(f"== stage {st.name}: {res.status} in {res.seconds:.0f} s {res.note}", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for st in chosen:
        if st.alone:
            res, _ = run_stage(st, OUT, buffered=False)
            results[st.name] = res
            print(f"== stage {st.name}: {res.status} in {res.seconds:.0f} s {res.note}", flush=True)
    return [results[st.name] for st in chosen]


def table(results: list[Result]) -> str:
    rows = [("stage", "result", "passed", "failed", "skipped", "seconds", "note")]
    for r in results:
        rows.append((r.stage, r.status, str(r.passed), str(r.failed), str(r.skipped), f"{r.seconds:.0f}", r.note))
    total = sum(r.seconds for r in results)
    rows.append(
        (
            "(all)",
            "",
            str(sum(r.passed for r in results)),
            str(sum(r.failed for r in results)),
            str(sum(r.skipped for r in results)),
            f"{total:.0f}",
            "stage seconds summed (side-by-side stages overlap)",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = []
    for row in rows:
        lines.append(
            "  ".join(
                c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) if i in (2, 3, 4, 5) else c.ljust(widths[i])
                for i, c in enumerate(row[:6])
            )
            + ("  " + row[6] if row[6] else "")
        )
    return "\n".join(lines)


_last_results: list[Result] = []  # the latest run's results (for tests)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="STAGE", help="run only these stages")
    ap.add_argument("--list", action="store_true", help="list the stages and exit")
    ap.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("FIXPACK_STAGE_JOBS", "2")),
        help="stages run at a time (default 2, FIXPACK_STAGE_JOBS): most stages keep one core busy "
        "(an interpreter starting vLLM engines), so two share the 2-core machine",
    )
    ap.add_argument("extra", nargs="*", help="extra arguments for the main-suite pytest run (after --)")
    args = ap.parse_args(argv)
    all_stages = stages(args.extra)
    if args.list:
        for st in all_stages:
            print(f"{st.name:<20} {st.venv:<13} {st.bound:>5} s  {st.what}")
        return 0
    chosen = [s for s in all_stages if not s.long]
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in all_stages})
        if unknown:
            ap.error(f"no stage named {', '.join(unknown)} (--list shows them)")
        chosen = [s for s in all_stages if s.name in args.only]
    OUT.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    results = _pool(chosen, args.jobs)
    _last_results[:] = results
    wall = time.monotonic() - t_start
    print("\n== the stages" + (" (CI=true: a missing venv is a failure)" if in_ci() else ""))
    print(table(results))
    print(f"wall time of the test command: {wall:.0f} s")
    sources: dict[str, int] = {}
    for r in results:
        for reason, n in r.source_skips.items():
            sources[f"{r.stage}: {reason}"] = sources.get(f"{r.stage}: {reason}", 0) + n
    if sources:
        print("\n== checks left out because a release source could not be had")
        for reason, n in sorted(sources.items()):
            print(f"  {n:4d}  {reason}")
    print("\n== the slowest tests of each stage")
    for r in results:
        for secs, name in r.slowest[:5]:
            print(f"  {r.stage:<20} {secs:7.1f} s  {name}")
    (OUT / "stages.json").write_text(
        json.dumps({"wall_seconds": round(wall, 1), "ci": in_ci(), "results": [r.__dict__ for r in results]}, indent=1)
    )
    bad = [r.stage for r in results if r.status == "FAILED"]
    not_run = [r.stage for r in results if r.status == "NOT RUN"]
    if not_run:
        print(f"!!! not run (their venv is missing; a failure under CI=true): {', '.join(not_run)}")
    if bad:
        print(f"!!! FAILED stages: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
