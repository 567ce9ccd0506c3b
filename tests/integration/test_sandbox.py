"""A fix's process is kept inside its staging folder by the kernel, and caught by the driver
when the kernel cannot keep it there (packtests/sandbox_cases.py has the cases)."""

from __future__ import annotations

import json
import os

import pytest

from packtests import builders as B
from packtests import reliability_lib as L
from packtests.sandbox_cases import ESCAPES, landlock_here, run_escape

NO_LANDLOCK = landlock_here()


@pytest.mark.parametrize("esc", ESCAPES, ids=[e.id for e in ESCAPES])
def test_refused_by_the_kernel(esc, tmp_path):
    if NO_LANDLOCK:
        pytest.skip(f"this kernel cannot confine a process: {NO_LANDLOCK}")
    r = run_escape(esc, "landlock", tmp_path)
    assert "changed" not in r.stdout + r.stderr.split("refused by the kernel")[0]


@pytest.mark.parametrize("esc", ESCAPES, ids=[e.id for e in ESCAPES])
def test_caught_by_the_snapshot_with_landlock_off(esc, tmp_path):
    run_escape(esc, "hook", tmp_path)


def _apply(tmp_path, sandbox: str):
    root, tree = L.copy_pack("basic", tmp_path)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, env={"FIXPACK_SANDBOX": sandbox})
    assert r.returncode == 0, r.stdout + r.stderr
    v = B.fixpack("verify", "--profile", "test", "--root", str(tree), "--json", pack=root)
    assert v.returncode == 0, v.stdout + v.stderr
    return r, json.loads(v.stdout), json.loads((tree / ".fixpack" / "state.json").read_text())


def test_state_record_and_verify_say_landlock_was_in_force(tmp_path):
    if NO_LANDLOCK:
        pytest.skip(f"this kernel cannot confine a process: {NO_LANDLOCK}")
    r, verify, state = _apply(tmp_path, "auto")
    assert "Landlock is not available" not in r.stdout + r.stderr
    assert state["protection"]["sandbox"] == "landlock" and state["protection"]["abi"] >= 1
    if os.geteuid() == 0:
        assert state["protection"]["capabilities"] == "none" and "bounding" not in state["protection"]
    if state["protection"].get("seccomp"):
        # sealed by the kernel: the trees are compared once per run, not after each fix
        assert state["protection"]["detection"] == "snapshot per run"
        assert all(f["sandbox"].startswith("landlock ABI") and "seccomp" in f["sandbox"] for f in verify["fixes"])
    else:
        assert state["protection"]["detection"] == "snapshot per fix"
    assert verify["protection"] == state["protection"]
    assert all(f["sandbox"].startswith("landlock ABI") for f in verify["fixes"])


def test_forced_off_is_said_and_recorded(tmp_path):
    r, verify, state = _apply(tmp_path, "hook")
    # forced off: Landlock and the metadata filter; the capabilities are dropped and the
    # privileged calls filtered in every mode
    want = {
        "sandbox": "audit-hook",
        "reason": "Landlock forced off (FIXPACK_SANDBOX=hook)",
        "detection": "snapshot per fix",
        "capabilities": "none",
        "syscall_filter": "privileged calls",
    }
    if (
        "bounding" in state["protection"]
    ):  # not root: the bounding set cannot be emptied without CAP_SETPCAP, and says so
        want["bounding"] = state["protection"].get("bounding")
        assert "no CAP_SETPCAP; no_new_privs set" in want["bounding"]
    assert state["protection"] == want
    assert verify["protection"]["sandbox"] == "audit-hook"
    assert all(f["sandbox"].startswith("audit hook + snapshot") for f in verify["fixes"])


def test_unavailable_landlock_is_said_once_and_the_run_falls_back(tmp_path, monkeypatch):
    """A kernel without Landlock, emulated: the probe and the child's confinement both fail."""
    root, tree = L.copy_pack("basic", tmp_path)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, kernel_without="landlock")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert out.count("Landlock is not available here") == 1, out
    state = json.loads((tree / ".fixpack" / "state.json").read_text())
    assert state["protection"]["sandbox"] == "audit-hook" and "the kernel has no Landlock (ENOSYS" in state["protection"]["reason"]


def test_required_landlock_that_is_missing_fails_the_fix(tmp_path):
    root, tree = L.copy_pack("basic", tmp_path)
    before = B.tree_digest(tree)
    r = B.fixpack(
        "apply",
        "--profile",
        "test",
        "--root",
        str(tree),
        pack=root,
        env={"FIXPACK_SANDBOX": "landlock"},
        kernel_without="landlock",
    )
    assert r.returncode == 4 and "FIXPACK_SANDBOX=landlock, but Landlock cannot confine" in r.stdout + r.stderr
    assert B.tree_digest(tree) == before


@pytest.mark.parametrize(
    "body, msg",
    [
        # the two ways the audit hook was bypassed before it checked link sources and dir_fd names
        (
            "os.link(os.environ['FIXPACK_TEST_TREE'] + '/pkg_a/__init__.py', 'h')\nopen('h', 'a').write('x')",
            "outside its staging area",
        ),
        (
            "d = os.open(os.environ['FIXPACK_TEST_TREE'] + '/pkg_a', os.O_RDONLY)\nos.write(os.open('__init__.py', os.O_WRONLY, dir_fd=d), b'x')",
            "relative name",
        ),
        (
            "d = os.open(os.environ['FIXPACK_TEST_TREE'] + '/pkg_a', os.O_RDONLY)\nos.rename('mod.py', 'gone.py', src_dir_fd=d, dst_dir_fd=d)",
            "outside its staging area",
        ),
        ("os.truncate(os.environ['FIXPACK_TEST_TREE'] + '/pkg_a/mod.py', 0)", "outside its staging area"),
    ],
    ids=["os.link", "os.open-dir_fd", "os.rename-dir_fd", "os.truncate"],
)
def test_the_hook_alone_refuses_the_python_level_ways(body, msg, tmp_path):
    """With Landlock forced off the audit hook still refuses these before the system call."""
    root, tree = L.copy_pack("codemod-first", tmp_path)
    from packtests.hostile_cases import Ctx

    Ctx(root, tree, tmp_path, tmp_path / "m").codemod(body + "\nreturn node")
    B.forge_lock(root, "fix-two")
    before = B.tree_digest(tree)
    r = B.fixpack(
        "apply",
        "--profile",
        "test",
        "--root",
        str(tree),
        pack=root,
        env={"FIXPACK_TEST_TREE": str(tree), "FIXPACK_SANDBOX": "hook"},
    )
    out = r.stdout + r.stderr
    assert r.returncode == 4 and msg in out, out[-2000:]
    assert "outside its targets" not in out  # refused before anything changed
    assert B.tree_digest(tree) == before


def test_bad_sandbox_value_is_a_configuration_error(tmp_path):
    root, tree = L.copy_pack("basic", tmp_path)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, env={"FIXPACK_SANDBOX": "off"})
    assert r.returncode == 2 and "FIXPACK_SANDBOX=off: expected one of auto, landlock, hook" in r.stdout + r.stderr


def test_sealed_fix_processes_are_compared_once_per_run(tmp_path, monkeypatch, capsys):
    """Landlock + the seccomp filter: no per-fix scan of the trees, one comparison at the end."""
    if NO_LANDLOCK:
        pytest.skip(f"this kernel cannot confine a process: {NO_LANDLOCK}")
    import fixpack.sandbox.watch as W
    from fixpack.cli.main import main

    root, tree = L.copy_pack("basic", tmp_path)
    scans = []
    real = W.scan
    monkeypatch.setattr(W, "scan", lambda roots, skip, deep=None: scans.append(len(roots)) or real(roots, skip, deep))
    monkeypatch.setenv("FIXPACK_SANDBOX", "auto")
    assert main(["apply", "--profile", "test", "--root", str(tree), "--pack", str(root)]) == 0
    state = json.loads((tree / ".fixpack" / "state.json").read_text())
    assert state["protection"]["seccomp"] is True and state["protection"]["detection"] == "snapshot per run"
    # whole-tree scans: the one before the first fix and the one after the last (the driver's
    # own commits re-scan only the folders they wrote, each with one root per folder)
    whole = [n for n in scans if n == 3]  # pkg_a, pkg_b and the state folder
    assert len(whole) == 2, scans

    scans.clear()
    monkeypatch.setenv("FIXPACK_SANDBOX", "hook")
    root2, tree2 = L.copy_pack("basic", tmp_path / "hook")
    assert main(["apply", "--profile", "test", "--root", str(tree2), "--pack", str(root2)]) == 0
    assert len([n for n in scans if n == 3]) == 3, scans  # before, then after each of the two fixes


def test_a_change_by_another_process_during_a_sealed_run_is_found_at_its_end(tmp_path):
    if NO_LANDLOCK:
        pytest.skip(f"this kernel cannot confine a process: {NO_LANDLOCK}")
    root, tree = L.copy_pack("basic", tmp_path)
    victim = tree / "pkg_b" / "x.py"  # no fix of the default selection touches pkg_b
    r = B.fault_fixpack(
        "apply",
        "--profile",
        "test",
        "--root",
        str(tree),
        pack=root,
        faults={
            "FAULT_AT_LABEL": "state written for apply fix-one",
            "FAULT_ACTION": f"edit:{victim}",
            "FIXPACK_SANDBOX": "auto",
        },
    )
    out = r.stdout + r.stderr
    assert r.returncode == 6, out
    assert f"{victim} changed outside the fixes' targets while this run applied fix-one, fix-two" in out
    assert "no fix's process can have made it" in out and "NOT restored" in out
    # the fixes themselves are applied as pinned, and verify says so
    v = B.fixpack("verify", "--profile", "test", "--root", str(tree), "--json", pack=root)
    assert [f["status"] for f in json.loads(v.stdout)["fixes"]] == ["applied", "applied"], v.stdout
