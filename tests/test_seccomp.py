"""The metadata filter that, with Landlock, seals a fix's process (fixpack/seccomp.py)."""

from __future__ import annotations

import errno
import fcntl
import os
import struct

import pytest

from fixpack import seccomp


@pytest.mark.parametrize("machine", sorted(seccomp._ARCH))
def test_the_program_jumps_only_forward_and_names_every_call(machine):
    prog = seccomp._program(machine)
    arch, ioctl_nr, calls, _ = seccomp._ARCH[machine]
    allow = (seccomp._RET_K, 0, 0, seccomp._RET_ALLOW)
    deny = (seccomp._RET_K, 0, 0, seccomp._RET_ERRNO | errno.EPERM)
    assert prog[-1] == deny and allow in prog
    denied = set()
    for i, (code, jt, jf, k) in enumerate(prog):
        if code & 0x07 != 0x05:  # not a jump
            continue
        assert i + 1 + max(jt, jf) < len(prog), (i, code, jt, jf)  # classic BPF: forward, inside
        if prog[i + 1 + jt] == deny:
            denied.add(k)
    assert arch not in denied and set(calls.values()) <= denied
    assert ioctl_nr not in calls.values() and set(seccomp._IOCTLS) <= denied


def _in_child(fn) -> list:
    """Run ``fn`` in a forked child with the filter installed; returns what it wrote back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            seccomp.deny_metadata_changes()
            os.write(w, repr(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return eval(data.decode())  # noqa: S307 - our own child's repr of a list of tuples


@pytest.mark.skipif(not seccomp.supported(), reason="seccomp filter numbers are known for Linux x86_64 and aarch64 only")
def test_metadata_calls_are_refused_and_the_rest_allowed(tmp_path):
    f = tmp_path / "f"
    f.write_text("a")
    mode, mtime = f.stat().st_mode, f.stat().st_mtime_ns

    def probe():
        out = []
        fd = os.open(f, os.O_RDONLY)
        for name, call in [
            ("chmod", lambda: os.chmod(f, 0o777)),
            ("fchmod", lambda: os.fchmod(fd, 0o777)),
            ("chown", lambda: os.chown(f, 1, 1)),
            ("utime", lambda: os.utime(f, ns=(0, 0))),
            ("setxattr", lambda: os.setxattr(f, "user.x", b"1")),
            ("FS_IOC_SETFLAGS", lambda: fcntl.ioctl(fd, 0x40086602, struct.pack("i", 0x10))),
            ("write", lambda: open(f, "a").write("b")),
            ("stat", lambda: os.stat(f)),
            ("FIONREAD", lambda: fcntl.ioctl(fd, 0x541B, struct.pack("i", 0))),  # not a metadata request
        ]:
            try:
                call()
                out.append((name, "ok"))
            except OSError as exc:
                out.append((name, exc.errno))
        return out

    got = dict(_in_child(probe))
    for name in ("chmod", "fchmod", "chown", "utime", "setxattr", "FS_IOC_SETFLAGS"):
        assert got[name] == errno.EPERM, got
    assert got["write"] == "ok" and got["stat"] == "ok"
    assert got["FIONREAD"] != errno.EPERM  # allowed through: the file system answers (0 or ENOTTY)
    assert f.stat().st_mode == mode and f.read_text() == "ab" and f.stat().st_mtime_ns != 0
    assert mtime  # the write moved it; utime could not have set it to 0
