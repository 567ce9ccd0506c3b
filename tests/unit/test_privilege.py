"""A fix's process holds no privilege: each layer alone, in a forked child (fixpack/sandbox/privilege.py,
fixpack/sandbox/landlock.py's stage grant, fixpack/sandbox/seccomp.py's privileged calls)."""

from __future__ import annotations

import errno
import os
import resource
import socket
import stat
import threading

import pytest

from fixpack.sandbox import landlock, privilege, seccomp
from packtests.sandbox_cases import landlock_here


def _in_child(setup, probes) -> dict:
    """Run ``setup`` then each probe in a forked child; probe name -> "ok" or the errno."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out: dict = {}
        try:
            os.close(r)
            out["setup"] = setup()
            for name, call in probes:
                try:
                    call()
                    out[name] = "ok"
                except OSError as exc:
                    out[name] = exc.errno
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out["crash"] = repr(exc)
        finally:
            os.write(w, repr(out).encode())
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return eval(data.decode())  # noqa: S307 - our own child's repr of a dict of str and int


def _status() -> dict:
    with open("/proc/self/status") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the capabilities to drop")
def test_every_capability_is_dropped_and_root_cannot_make_a_device(tmp_path):
    dev = tmp_path / "null2"

    def caps():
        return {k: v for k, v in _status().items() if k.startswith("Cap") or k == "NoNewPrivs"}

    got = _in_child(
        lambda: (privilege.drop_all(), caps()),
        [
            ("mknod-char", lambda: os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))),
            ("chown-other", lambda: os.chown(tmp_path, 1234, 1234)),  # CAP_CHOWN gone
            ("write-own", lambda: (tmp_path / "f").write_text("x")),  # the uid still owns its files
        ],
    )
    assert "crash" not in got, got
    dropped, sets = got["setup"]
    assert dropped == {"capabilities": "none"}
    assert all(int(sets[k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), sets
    assert sets["NoNewPrivs"].strip() == "1"
    assert got["mknod-char"] == errno.EPERM and not dev.exists()
    assert got["chown-other"] == errno.EPERM and tmp_path.stat().st_uid == 0
    assert got["write-own"] == "ok"


@pytest.mark.skipif(bool(landlock_here()), reason=f"no Landlock here: {landlock_here()}")
def test_landlock_grants_no_fifo_socket_or_device_beneath_the_stage(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()

    def unix_socket():
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(stage / "sock"))
        finally:
            s.close()

    got = _in_child(
        lambda: landlock.confine(str(stage)),
        [
            ("fifo", lambda: os.mkfifo(stage / "fifo")),
            ("unix-socket", unix_socket),
            ("file", lambda: (stage / "out").write_text("x")),
            ("folder", lambda: os.mkdir(stage / "d")),
        ],
    )
    assert "crash" not in got, got
    assert got["fifo"] == errno.EACCES and got["unix-socket"] == errno.EACCES, got
    assert got["file"] == "ok" and got["folder"] == "ok"
    assert sorted(p.name for p in stage.iterdir()) == ["d", "out"]


@pytest.mark.skipif(not seccomp.supported(), reason="seccomp numbers are known for Linux x86_64 and aarch64 only")
@pytest.mark.parametrize("metadata", [True, False], ids=["with-landlock", "privileged-only"])
def test_the_filter_refuses_other_processes_and_privileged_calls(tmp_path, metadata):
    parent = os.getpid()
    before = (resource.prlimit(parent, resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, parent))

    def thread():
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()

    got = _in_child(
        lambda: seccomp.install(metadata=metadata),
        [
            ("mknod-fifo", lambda: os.mkfifo(tmp_path / "fifo")),
            ("prlimit-parent", lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE, (11, 11))),
            ("prlimit-self", lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))),
            ("setpriority-parent", lambda: os.setpriority(os.PRIO_PROCESS, parent, 19)),
            ("setpriority-user", lambda: os.setpriority(os.PRIO_USER, 0, 19)),
            ("nice-self", lambda: os.setpriority(os.PRIO_PROCESS, 0, 1)),
            ("sched-parent", lambda: os.sched_setaffinity(parent, {0})),
            ("fork", lambda: os.fork() == 0 and os._exit(0)),
            ("thread", thread),
            ("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()),
            ("netlink-dgram", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0).close()),
            (
                "raw",
                lambda: socket.socket(
                    socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_ICMP
                ).close(),
            ),
            ("tcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
            ("chmod", lambda: os.chmod(tmp_path, 0o777)),
        ],
    )
    assert "crash" not in got, got
    for name in (
        "mknod-fifo",
        "prlimit-parent",
        "setpriority-parent",
        "setpriority-user",
        "sched-parent",
        "fork",
        "netlink",
        "netlink-dgram",
        "raw",
    ):
        assert got[name] == errno.EPERM, (name, got)
    for name in ("prlimit-self", "nice-self", "thread", "tcp"):
        assert got[name] == "ok", (name, got)
    assert got["chmod"] == (errno.EPERM if metadata else "ok")
    assert not (tmp_path / "fifo").exists()
    assert (resource.prlimit(parent, resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, parent)) == before
