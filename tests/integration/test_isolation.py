"""No code from a place another user can write runs in an interpreter fixpack starts (issue 41,
item 1): the fork servers (and so every fix's process) run ``-I -S`` with an explicit path, in
``/``; a folder on the path that another user can write is refused by name before anything
starts; ``python -I -S apply_all.py`` gives the driver the same isolation.

The site hook is a ``.pth`` file planted in a throwaway venv's site-packages (the package
folders' owner's move when site-packages is theirs): it records the pid of every interpreter
that runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixpack.sandbox import interpreter
from fixpack.sandbox.forkserver import ForkServer
from packtests import builders as B
from packtests import reliability_lib as L


def _venv_with_a_planted_pth(tmp_path: Path) -> tuple[Path, Path]:
    """A venv of this interpreter whose site-packages holds a .pth that puts this venv's
    packages on the path (so fixpack's dependencies import) and records who ran it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "yaml").is_dir())
    marker = tmp_path / "ran"
    (site / "zz-planted.pth").write_text(
        f"{ours}\nimport os; open({str(marker)!r}, 'a').write(str(os.getpid()) + chr(10))\n"
    )
    return venv / "bin" / "python", marker


def _run(python: Path, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(B.REPO), PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=300, env=e, cwd=B.REPO)


@pytest.mark.parametrize("kind", ["diff", "codemod"])
def test_a_planted_pth_file_runs_in_no_fork_server_and_no_fix_process(tmp_path, kind):
    python, marker = _venv_with_a_planted_pth(tmp_path)
    root, tree = L.copy_pack("basic" if kind == "diff" else "codemod-first", tmp_path)
    r = _run(python, ["-m", "fixpack", "apply", "--profile", "test", "--root", str(tree), "--pack", str(root)])
    assert r.returncode == 0, r.stdout + r.stderr
    pids = set(marker.read_text().split())
    # the driver was started plainly by the test, so its own site hook ran: one interpreter, not
    # three (before: the driver and both fork servers)
    assert len(pids) == 1, pids
    v = _run(python, ["-m", "fixpack", "verify", "--profile", "test", "--root", str(tree), "--pack", str(root)])
    assert v.returncode == 0 and "no drift" in v.stdout


def test_with_dash_i_dash_s_the_planted_pth_runs_nowhere_and_apply_all_still_works(tmp_path):
    python, marker = _venv_with_a_planted_pth(tmp_path)
    root, tree = L.copy_pack("basic", tmp_path)
    # what apply_all.py then finds on its own: the venv's site-packages as a plain folder; the
    # planted .pth put this test's packages there, so here they come from PYTHONPATH... which -I
    # ignores: give them as the venv's own, by a symlink (no .pth is read either way)
    venv_site = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "yaml").is_dir())
    for name in ("yaml", "libcst", "unidiff", "typing_extensions.py", "_yaml"):
        if (Path(ours) / name).exists():
            (venv_site / name).symlink_to(Path(ours) / name)
    args = ["-I", "-S", str(B.REPO / "apply_all.py"), "--profile", "test", "--root", str(tree), "--pack", str(root)]
    r = _run(python, args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not marker.exists(), marker.read_text()
    again = _run(python, args)
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr
    assert not marker.exists()


def test_the_fork_servers_run_isolated_in_a_folder_only_root_can_write(tmp_path):
    os.chdir(tmp_path)  # the driver's working folder is not the servers'
    try:
        server = ForkServer(preload="")
        server.start()
        assert server.proc is not None
        pid = server.proc.pid
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        # Popen returns once the child is past vfork, which is a moment before exec has laid out
        # the new arguments: until then the kernel shows none
        deadline = time.monotonic() + 10
        while (argv := Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")) == [b""] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert argv[1:4] == [b"-I", b"-S", b"-B"], argv
        path = interpreter.server_path()
        assert path[0] == str(B.REPO) and str(tmp_path) not in path
        server.close()
    finally:
        os.chdir(B.REPO)


@pytest.mark.parametrize("how", ["mode-777", "group-writable", "owned-by-another-user", "parent-777-without-sticky"])
def test_a_path_entry_another_user_can_write_is_refused_by_name_before_anything_starts(tmp_path, how):
    root, tree = L.copy_pack("basic", tmp_path)
    entry = tmp_path / "extra" / "lib"
    entry.mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    if how == "mode-777":
        os.chmod(entry, 0o777)
        why = f"{entry} is writable by others (mode 0o777)"
    elif how == "group-writable":
        os.chown(entry, 0, 4321) if os.geteuid() == 0 else pytest.skip("needs root to chown")
        os.chmod(entry, 0o775)
        why = f"{entry} is writable by group 4321"
    elif how == "owned-by-another-user":
        if os.geteuid() != 0:
            pytest.skip("needs root to chown")
        os.chown(entry, 4321, 4321)
        why = f"{entry} is owned by uid 4321"
    else:
        os.chmod(entry.parent, 0o777)
        why = f"{entry.parent} is writable by others without the sticky bit"
    before = B.tree_digest(tree)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root,
                  env={"PYTHONPATH": f"{B.REPO}{os.pathsep}{entry}"})  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 6, out
    assert f"{entry}: on the driver's path, and another user can write there ({why}" in out, out
    assert "nothing was started" in out and "Traceback" not in out
    assert B.tree_digest(tree) == before
