"""The metadata filter that, with Landlock, seals a fix's process (fixpack/sandbox/seccomp.py)."""

from __future__ import annotations

import errno
import fcntl
import os
import struct

import pytest

from fixpack.sandbox import seccomp


def _run(prog, nr: int, arch: int, args=(0, 0, 0, 0, 0, 0)) -> int:
    """What the kernel would answer: a small interpreter of the instructions the filter uses."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & (2**64 - 1) for a in (*args, 0, 0, 0, 0, 0, 0)[:6]])
    a, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == seccomp._LD_W_ABS:
            a = struct.unpack_from("<I", data, k)[0]
        elif code == seccomp._ALU_AND_K:
            a &= k
        elif code == seccomp._RET_K:
            return k
        else:
            hit = {seccomp._JEQ_K: a == k, seccomp._JGE_K: a >= k, seccomp._JSET_K: bool(a & k)}[code]
            pc += jt if hit else jf
        assert pc < len(prog)


ALLOW, EPERM, ENOSYS = seccomp._RET_ALLOW, seccomp._RET_ERRNO | errno.EPERM, seccomp._RET_ERRNO | errno.ENOSYS


@pytest.mark.parametrize("machine", sorted(seccomp._ARCH))
@pytest.mark.parametrize("metadata", [True, False], ids=["with-landlock", "privileged-only"])
def test_the_program_refuses_what_it_lists_on_every_architecture(machine, metadata):
    arch, ioctl_nr, meta, priv, args, x32 = seccomp._ARCH[machine]
    prog = seccomp._program(machine, metadata)
    for code, jt, jf, _ in prog:  # classic BPF: forward jumps inside the program only
        assert code & 0x07 != 0x05 or max(jt, jf) < 256
    for name, nr in priv.items():
        assert _run(prog, nr, arch) == EPERM, name
    for name, nr in meta.items():
        assert _run(prog, nr, arch) == (EPERM if metadata else ALLOW), name
    assert _run(prog, priv["reboot"], arch ^ 1) == EPERM  # another table: refused whole
    if x32:
        assert _run(prog, x32 | 0, arch) == EPERM
    assert _run(prog, ioctl_nr, arch, (3, 0x40086602)) == (EPERM if metadata else ALLOW)
    assert _run(prog, ioctl_nr, arch, (3, 0x541B)) == ALLOW  # FIONREAD
    # the pid calls: only 0, this process; the kernel reads an int argument's low 32 bits
    for name in ("prlimit64", "sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr"):
        assert _run(prog, args[name], arch, (0, 7)) == ALLOW, name
        assert _run(prog, args[name], arch, (1, 7)) == EPERM, name
        assert _run(prog, args[name], arch, (12345, 7)) == EPERM, name
    assert _run(prog, args["setpriority"], arch, (0, 0, 5)) == ALLOW
    assert _run(prog, args["setpriority"], arch, (0, 42, 5)) == EPERM  # another process
    assert _run(prog, args["setpriority"], arch, (1, 0, 5)) == EPERM  # the whole process group
    assert _run(prog, args["setpriority"], arch, (2, 0, 5)) == EPERM  # every process of the user
    assert _run(prog, args["ioprio_set"], arch, (1, 0, 4)) == ALLOW
    assert _run(prog, args["ioprio_set"], arch, (1, 42, 4)) == EPERM
    assert _run(prog, args["ioprio_set"], arch, (3, 0, 4)) == EPERM
    assert _run(prog, args["clone"], arch, (0x3D0F00,)) == ALLOW  # pthread_create's flags
    assert _run(prog, args["clone"], arch, (0x11,)) == EPERM  # fork: SIGCHLD only
    assert _run(prog, args["clone"], arch, (0x01000000 | 0x00200000 | 0x11,)) == EPERM  # glibc fork's
    assert _run(prog, args["clone3"], arch) == ENOSYS
    assert _run(prog, args["socket"], arch, (2, 1 | 0x80000)) == ALLOW  # AF_INET stream, cloexec
    assert _run(prog, args["socket"], arch, (1, 2)) == ALLOW  # AF_UNIX datagram
    assert _run(prog, args["socket"], arch, (16, 3)) == EPERM  # netlink
    assert _run(prog, args["socket"], arch, (16, 2)) == EPERM
    assert _run(prog, args["socket"], arch, (17, 2)) == EPERM  # AF_PACKET
    assert _run(prog, args["socket"], arch, (2, 3 | 0x800)) == EPERM  # raw, non-blocking
    assert _run(prog, args["socket"], arch, (10, 10)) == EPERM  # SOCK_PACKET
    assert _run(prog, 0 if machine == "x86_64" else 63, arch, (3, 0, 10)) == ALLOW  # read
    # io_uring carries calls the filter never sees: refused in every mode, hook mode included
    for name, nr in (("io_uring_setup", 425), ("io_uring_enter", 426), ("io_uring_register", 427)):
        assert priv[name] == nr and _run(prog, nr, arch) == EPERM, name


@pytest.mark.skipif(
    not seccomp.supported(), reason="seccomp filter numbers are known for Linux x86_64 and aarch64 only"
)
def test_io_uring_is_refused_without_landlock_too():
    """The privileged part alone (FIXPACK_SANDBOX=hook): io_uring_setup answers EPERM."""
    import ctypes

    def probe():
        seccomp.install(metadata=False)
        libc = ctypes.CDLL(None, use_errno=True)
        params = ctypes.create_string_buffer(120)  # struct io_uring_params
        fd = libc.syscall(425, 8, params)
        return [fd, ctypes.get_errno()]

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.write(w, repr(probe()).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = eval(os.read(r, 1000).decode())  # noqa: S307 - our own child's repr of a list
    os.close(r)
    os.waitpid(pid, 0)
    assert got == [-1, errno.EPERM]


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


@pytest.mark.skipif(
    not seccomp.supported(), reason="seccomp filter numbers are known for Linux x86_64 and aarch64 only"
)
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
