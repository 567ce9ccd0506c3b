"""Bounded resources and no survivors (issue 30, deliver 2): per-fix limits reported as "fix X
exceeded LIMIT", output kept up to a bound, change files bounded in size, and no process a fix
starts outliving it."""

from __future__ import annotations

import re
import time

import pytest

from fixpack.errors import ConfigError
from fixpack.sandbox import limits
from packtests import builders as B
from packtests import reliability_lib as L
from packtests.forkserver_jobs import job, result
from packtests.hostile_cases import Ctx
from packtests.sandbox_cases import PRELUDE


def test_limits_parse_defaults_and_overrides():
    d = limits.parse(None)
    assert d == {name: spec[1] for name, spec in limits.LIMITS.items()}
    got = limits.parse("as=2G, fsize=10M,cpu=7")
    assert got["as"] == 2 << 30 and got["fsize"] == 10 << 20 and got["cpu"] == 7 and got["nofile"] == d["nofile"]
    for bad in ("mem=1G", "as", "as=-1", "as=1T", "cpu=1M", "nofile=0"):
        with pytest.raises(ConfigError, match="FIXPACK_LIMITS"):
            limits.parse(bad)


def _run(tmp_path, body: str, env: dict, kernel_without: str | None = None):
    root, tree = L.copy_pack("codemod-first", tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    decoy = outside / "decoy.py"
    decoy.write_text("decoy = 1\n")
    Ctx(root, tree, outside, outside / "pwned").codemod(PRELUDE.strip("\n") + "\n" + body + "\nreturn node")
    B.forge_lock(root, "fix-two")
    before = B.tree_digest(tree)
    t0 = time.monotonic()
    r = B.fixpack(
        "apply",
        "--profile",
        "test",
        "--root",
        str(tree),
        pack=root,
        env={"FIXPACK_TEST_TREE": str(tree), **env},
        kernel_without=kernel_without,
    )
    r.seconds = time.monotonic() - t0
    r.unchanged = B.tree_digest(tree) == before and decoy.read_text() == "decoy = 1\n"
    r.outside = outside
    return r


CASES = [
    ("as", "as=2G", "x = bytearray(3 << 30)", "the address space limit (as=2G"),
    ("fsize", "fsize=1M", "open('big', 'wb').write(b'x' * (2 << 20))", "the file size limit (fsize=1M"),
    ("nofile", "nofile=64", "keep = [open(os.devnull) for _ in range(100)]", "the open files limit (nofile=64"),
    ("cpu", "cpu=1", "while True:\n    pass", "the CPU time limit (cpu=1"),
]


@pytest.mark.parametrize("mode", ["auto", "hook"])
@pytest.mark.parametrize("name, setting, body, msg", CASES, ids=[c[0] for c in CASES])
def test_an_exceeded_limit_fails_the_fix_naming_it(tmp_path, name, setting, body, msg, mode):
    r = _run(tmp_path, body, {"FIXPACK_LIMITS": setting, "FIXPACK_SANDBOX": mode})
    out = r.stdout + r.stderr
    assert r.returncode == 4, out[-2000:]
    assert f"fix fix-two exceeded {msg}" in out and "nothing was written" in out, out[-2000:]
    assert r.unchanged


def test_a_bad_limits_setting_is_a_configuration_error(tmp_path):
    root, tree = L.copy_pack("basic", tmp_path)
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root, env={"FIXPACK_LIMITS": "as=lots"})
    assert r.returncode == 2 and "FIXPACK_LIMITS: as=lots: expected a positive whole number" in r.stderr, r.stderr


def test_output_is_kept_up_to_a_bound_with_the_rest_counted(server, tmp_path):
    from fixpack.sandbox.forkserver import HEAD_BYTES, TAIL_BYTES

    flood = 64 << 20
    body = f"sys.stdout.write('y' * ({flood} // 8) + 'z' * ({flood} * 7 // 8) + chr(10)); sys.stdout.flush(); return replace_once(node, 'return 1', 'return 2')"
    warm = server.run(
        dict(job(tmp_path, "warm", "return replace_once(node, 'return 1', 'return 2')"), sandbox="hook"), timeout=60
    )
    assert warm["rc"] == 0, warm  # the server has imported everything: its peak is its own
    with open(f"/proc/{server.proc.pid}/status") as f:
        hwm0 = int(next(line for line in f if line.startswith("VmHWM")).split()[1])
    r = server.run(dict(job(tmp_path, "flood", body), sandbox="hook"), timeout=60)
    with open(f"/proc/{server.proc.pid}/status") as f:
        hwm1 = int(next(line for line in f if line.startswith("VmHWM")).split()[1])
    assert r["rc"] == 0, r["stderr"][-2000:]
    assert len(r["stdout"]) < HEAD_BYTES + TAIL_BYTES + 200
    assert r["dropped"]["stdout"] > flood - HEAD_BYTES - TAIL_BYTES
    assert "bytes of output left out" in r["stdout"]
    assert "outputs" in result(r) and r["stdout"].splitlines()[0].startswith('{"protection"')
    assert hwm1 - hwm0 < 32 << 10, (hwm0, hwm1)  # KB: the server never held the flood


def test_a_change_file_larger_than_the_bound_is_refused_before_it_is_read(tmp_path):
    root, tree = L.copy_pack("basic", tmp_path)
    diff = root / "fixes" / "fix-one" / "patch.diff"
    diff.write_bytes(diff.read_bytes() + b"#" * (2 << 20))
    r = B.fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{diff}: {diff.stat().st_size} bytes; a pack file may have at most 1048576 (1 MiB)" in r.stderr


@pytest.mark.parametrize("mode", ["auto", "hook"])
def test_a_setsid_double_forked_grandchild_does_not_outlive_its_fix(tmp_path, mode):
    """Without the seccomp filter a fix can fork; the fork server, a subreaper, kills whatever
    it left running before the driver compares the tree, and does not wait for it."""
    body = (
        "if libc.fork() == 0:\n"
        "    libc.setsid()\n"
        "    if libc.fork() == 0:\n"
        "        import time\n"
        "        time.sleep(4)\n"
        "        open(os.environ['FIXPACK_TEST_TREE'] + '/../outside/survived', 'w').write('x')\n"
        "    os._exit(0)"
    )
    # a kernel without seccomp filters (emulated): the privileged-call filter is not installed
    r = _run(tmp_path, body, {"FIXPACK_SANDBOX": mode}, kernel_without="seccomp")
    out = r.stdout + r.stderr
    # the grandchild, and its parent if it had not finished exiting when the fix's process ended
    assert re.search(r"fix fix-two left [12] process\(es\) running after its own ended; they were killed", out), out[
        -2000:
    ]
    assert r.seconds < 30, r.seconds  # the grandchild held the output pipes: not waited for
    time.sleep(5)
    assert not (r.outside / "survived").exists()
