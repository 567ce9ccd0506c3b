"""The fork server: each fix runs in its own forked child of one server that has imported the
fix machinery once; a child that crashes, hangs or dies leaves the server serving."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fixpack.sandbox.forkserver import ForkServer, ServerDied
from packtests.builders import REPO
from packtests.forkserver_jobs import SRC, job, result


def test_jobs_run_in_children_of_one_server(server, tmp_path):
    first = server.run(job(tmp_path, "a", "return replace_once(node, 'return 1', 'return 2')"), timeout=60)
    assert first["rc"] == 0 and not first["timed_out"], first
    assert Path(result(first)["outputs"]["pkg/t.py"]).read_text() == SRC.replace("1", "2")
    pid = server.proc.pid
    # each job is its own process: its pid is neither the server's nor the previous job's
    a = server.run(job(tmp_path, "b", "print(os.getpid(), os.getppid()); return replace_once(node, 'return 1', 'return 3')"), timeout=60)
    b = server.run(job(tmp_path, "c", "print(os.getpid(), os.getppid()); return replace_once(node, 'return 1', 'return 4')"), timeout=60)
    # the first line is the worker's own word on its confinement; the fix's print follows it
    (pa, ppa), (pb, ppb) = (tuple(map(int, r["stdout"].splitlines()[1].split()[:2])) for r in (a, b))
    assert ppa == ppb == pid and len({pa, pb, pid}) == 3
    assert server.proc.pid == pid  # one server for all of them


def test_a_crashing_child_is_reported_and_the_server_serves_on(server, tmp_path):
    crash = server.run(job(tmp_path, "segv", "import ctypes; ctypes.string_at(0)"), timeout=60)
    assert crash["rc"] == -11 and not crash["timed_out"]
    exited = server.run(job(tmp_path, "exit", "sys.stderr.write('going\\n'); sys.stderr.flush(); os._exit(3)"), timeout=60)
    assert exited["rc"] == 3 and "going" in exited["stderr"]
    ok = server.run(job(tmp_path, "ok", "return replace_once(node, 'return 1', 'return 2')"), timeout=60)
    assert ok["rc"] == 0


def test_a_hanging_child_is_killed_at_its_timeout(server, tmp_path):
    hung = server.run(job(tmp_path, "hang", "while True: pass"), timeout=1)
    assert hung["timed_out"] and hung["rc"] is None
    ok = server.run(job(tmp_path, "ok", "return replace_once(node, 'return 1', 'return 2')"), timeout=60)
    assert ok["rc"] == 0


def test_a_child_may_not_write_outside_its_stage_or_start_processes(server, tmp_path):
    outside = tmp_path / "outside.txt"
    w = server.run(job(tmp_path, "w", f"open({str(outside)!r}, 'w').write('x')"), timeout=60)
    assert w["rc"] == 1 and "outside its staging area" in result(w)["error"] and not outside.exists()
    p = server.run(job(tmp_path, "p", "os.system('true')"), timeout=60)
    assert p["rc"] == 1 and "tried to start a process" in result(p)["error"]


def test_the_release_checks_test_runs_are_jobs_of_the_same_server(server, tmp_path):
    """A tests job (fixpack.proofs.proof) runs pytest in a forked child with its own environment
    and working folder, stderr merged into stdout; a hanging one is killed at its timeout."""
    (tmp_path / "test_a.py").write_text(
        "import os, sys\n\n"
        "def test_env_and_cwd():\n    sys.stderr.write('to stderr\\n')\n"
        "    assert os.environ['ONLY'] == '1' and 'HOME' not in os.environ and os.getcwd() == os.environ['WHERE']\n\n"
        "def test_red():\n    assert 1 == 2\n"
    )
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hang():\n    time.sleep(60)\n")
    args = ["-q", "-s", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path)]
    env = {"ONLY": "1", "WHERE": str(tmp_path), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    run = {"args": [*args, str(tmp_path / "test_a.py")], "env": env, "cwd": str(tmp_path)}
    reply = server.run({"tests": run}, timeout=120)
    assert reply["rc"] == 1 and not reply["timed_out"], reply
    assert "1 failed, 1 passed" in reply["stdout"] and "to stderr" in reply["stdout"] and reply["stderr"] == ""
    hung = server.run({"tests": dict(run, args=[*args, str(tmp_path / "test_hang.py")])}, timeout=3)
    assert hung["timed_out"] and hung["rc"] is None
    bad = server.run({"tests": dict(run, cwd=str(tmp_path / "missing"))}, timeout=60)
    assert bad["rc"] == 3  # pytest could not run at all: its internal-error code


def test_a_dead_server_is_reported_and_replaced(server, tmp_path):
    server.start()
    server.proc.kill()
    server.proc.wait()
    with pytest.raises(ServerDied, match="fix process server"):
        # a server that died between jobs cannot take the next one...
        server.proc.poll = lambda: None  # ...as seen by a driver that has not noticed yet
        server.run(job(tmp_path, "a", "return node"), timeout=10)
    ok = server.run(job(tmp_path, "b", "return replace_once(node, 'return 1', 'return 2')"), timeout=60)
    assert ok["rc"] == 0


def test_the_server_imports_no_target_package_and_an_edit_no_libcst(tmp_path):
    code = (
        "import sys, fixpack.sandbox.forkserver as f\n"
        "sys.stdin = open(sys.argv[1])\n"
        "f.serve()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'vllm_gaudi', 'libcst')), file=sys.stderr)\n"
    )
    j = job(tmp_path, "a", "return replace_once(node, 'return 1', 'return 2')")
    # the same change as an edit: only a codemod job brings libcst into the server
    (Path(j["fix_dir"]) / "codemod.py").unlink()
    (Path(j["fix_dir"]) / "edits.yaml").write_text("- {target: pkg/t.py, in: f, replace: return 1, with: return 2}\n")
    j["kind"] = "edit"
    from fixpack.apply.hashing import sha256_bytes

    j["expect"] = {"pkg/t.py": sha256_bytes(SRC.replace("1", "2").encode())}
    (tmp_path / "jobs").write_text(json.dumps(j) + "\n")
    import subprocess

    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "jobs")], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["rc"] == 0
    assert r.stderr.strip().splitlines()[-1] == "[]"


def test_what_confined_a_child_is_its_first_line_and_a_fix_cannot_forge_it(server, tmp_path):
    from fixpack.sandbox.runner import Runner

    forged = json.dumps({"protection": {"sandbox": "landlock", "abi": 7, "seccomp": True}})
    body = f"print({forged!r}, flush=True); return replace_once(node, 'return 1', 'return 2')"
    r = server.run(dict(job(tmp_path, "forge", body), sandbox="hook"), timeout=60)
    assert r["rc"] == 0, r
    lines = r["stdout"].splitlines()
    assert json.loads(lines[1]) == json.loads(forged)  # the fix did print its claim ...
    got = Runner.protection_of(r)  # ... but the driver reads the line written before the fix loaded
    assert got is not None and got["sandbox"] == "audit-hook" and got["reason"] == "Landlock forced off (FIXPACK_SANDBOX=hook)"
    assert "seccomp" not in got and "abi" not in got


def test_the_codemod_server_has_libcst_before_its_first_job_and_the_runner_starts_it_only_for_codemods(tmp_path):
    import subprocess

    code = (
        "import sys, fixpack.sandbox.forkserver as f\n"
        "sys.stdin = open(sys.argv[1])\n"
        "f.serve(sys.argv[2])\n"
        "print('libcst' in sys.modules, file=sys.stderr)\n"
    )
    (tmp_path / "none").write_text("")
    for preload, has in (("codemod", "True"), ("", "False")):
        r = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "none"), preload],
            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120,
        )
        assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == has, (preload, r.stderr)

    from fixpack.cli.output import Lines
    from fixpack.sandbox.runner import Runner

    runner = Runner([tmp_path], tmp_path, Lines(quiet=True))
    try:
        runner.start({"diff", "edit"})
        assert sorted(runner._forkservers) == [""]
        runner.start({"diff", "codemod"})
        assert sorted(runner._forkservers) == ["", "codemod"]
        assert [s.proc.poll() for s in runner._forkservers.values()] == [None, None]  # both running
    finally:
        runner.close()
    assert runner._forkservers == {}


def test_servers_started_before_the_engine_are_adopted_by_the_run_or_ended(tmp_path):
    from fixpack.cli.output import Lines
    from fixpack.sandbox import forkserver
    from fixpack.sandbox.runner import Runner

    forkserver.prestart(["", "codemod"])
    try:
        early = dict(forkserver._early)
        assert sorted(early) == ["", "codemod"]
        runner = Runner([tmp_path], tmp_path, Lines(quiet=True))
        runner.start({"codemod"})
        assert runner._forkservers["codemod"] is early["codemod"]  # the same process, not a second one
        assert sorted(forkserver._early) == [""]  # not adopted: the run had no diff or edit
        runner.close()
        assert early["codemod"].proc is None
    finally:
        forkserver.close_early()
    assert forkserver._early == {} and early[""].proc is None  # a server no run adopted is ended too


def test_a_command_that_stops_before_its_first_fix_leaves_no_server_running(pack, monkeypatch):
    """apply starts the servers before the engine is built; a refused run must not leave them."""
    from fixpack.cli.main import main
    from fixpack.sandbox import forkserver

    started = []
    real_start = forkserver.ForkServer.start

    def start(self):
        real_start(self)
        started.append(self.proc)

    monkeypatch.setattr(forkserver.ForkServer, "start", start)
    root, tree = pack
    assert main(["apply", "--pack", str(root), "--profile", "nope", "--root", str(tree)]) == 2
    assert len(started) == 2  # the plain server and the codemod one (the pack has a codemod)
    assert all(proc.poll() is not None for proc in started) and forkserver._early == {}


def test_a_server_that_took_no_job_is_ended_not_waited_for_and_one_that_did_exits_cleanly(server, tmp_path):
    from fixpack.sandbox.forkserver import server_env

    idle = ForkServer(server_env(), preload="codemod")
    idle.start()
    proc = idle.proc
    idle.close()  # still importing libcst: killed, not waited for
    assert proc is not None and proc.returncode == -9
    assert server.run(job(tmp_path, "a", "return replace_once(node, 'return 1', 'return 2')"), timeout=60)["rc"] == 0
    busy = server.proc
    server.close()  # it served: told to stop, and it exits by itself
    assert busy is not None and busy.returncode == 0


def test_the_codemod_servers_warm_up_leaves_every_attribute_of_dataclasses_as_it_was(tmp_path):
    import subprocess

    code = (
        "import dataclasses, inspect, sys\n"
        "before = dict(vars(dataclasses))\n"
        "import fixpack.sandbox.forkserver as f\n"
        "sys.stdin = open(sys.argv[1])\n"
        "f.serve('codemod')\n"
        "import libcst.matchers as m\n"
        "after = vars(dataclasses)\n"
        "changed = sorted(k for k in set(before) | set(after) if before.get(k, before) is not after.get(k, after))\n"
        "print(changed, dataclasses.inspect is inspect, m.FunctionDef.__doc__.startswith('FunctionDef(name: '))\n"
    )
    (tmp_path / "none").write_text("")
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "none")],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120,
    )
    assert r.returncode == 0, r.stderr
    # nothing swapped, added or removed; the matchers' docstrings are those dataclasses renders
    assert r.stdout.split() == ["[]", "True", "True"]


@pytest.mark.parametrize("preload", ["codemod", ""], ids=["codemod server", "libcst at the first codemod"])
def test_a_codemods_process_sees_dataclasses_and_inspect_as_the_standard_library_has_them(tmp_path, preload):
    from fixpack.sandbox.forkserver import server_env

    server = ForkServer(server_env(), preload=preload)
    try:
        probe = (
            "import dataclasses, inspect, types; "
            "mods = [v for v in vars(dataclasses).values() if isinstance(v, types.ModuleType)]; "
            "print('probe', dataclasses.inspect is inspect, all(sys.modules[v.__name__] is v for v in mods), "
            "m.Arg.__doc__.startswith('Arg(value: ')); return node"
        )
        reply = server.run(job(tmp_path, "a", probe), timeout=60)
    finally:
        server.close()
    assert reply["rc"] == 0, reply
    (line,) = [x for x in reply["stdout"].splitlines() if x.startswith("probe ")]
    assert line.split() == ["probe", "True", "True", "True"]
