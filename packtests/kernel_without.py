"""Run a command as on a kernel without Landlock, or without seccomp filters, emulated by the kernel.

    python -m packtests.kernel_without landlock|seccomp CMD ARG...

A seccomp filter installed here, which every descendant inherits across ``exec``, answers the
Landlock system calls with ENOSYS (as a kernel older than 5.13 does), or ``prctl(PR_SET_SECCOMP)``
with EINVAL and ``seccomp()`` with ENOSYS (as a kernel without the filter mode does); every other
call goes through. It reaches the fork servers and the fixes' processes as a real kernel would:
fixpack starts its servers ``-I -S``, so a ``sitecustomize`` shim on ``PYTHONPATH`` (how the
tests emulated such a kernel before) no longer runs in them, by design.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

from fixpack.sandbox import seccomp as S

# machine -> (prctl, seccomp) system call numbers; the Landlock calls are 444-446 on both
_NR = {"x86_64": (157, 317), "aarch64": (167, 277), "arm64": (167, 277)}
_LANDLOCK = (444, 445, 446)
_PR_SET_SECCOMP = 22


def program(without: str) -> list[tuple[int, int, int, int]]:
    arch = S._ARCH[platform.machine()][0]
    prctl_nr, seccomp_nr = _NR[platform.machine()]
    code: list[tuple] = [
        (S._LD_W_ABS, 0, 0, S._OFF_ARCH),
        (S._JEQ_K, 0, "allow", arch),
        (S._LD_W_ABS, 0, 0, S._OFF_NR),
    ]
    if without == "landlock":
        code += [(S._JEQ_K, "enosys", 0, nr) for nr in _LANDLOCK]
    elif without == "seccomp":
        code += [(S._JEQ_K, "enosys", 0, seccomp_nr), (S._JEQ_K, "prctl", 0, prctl_nr)]
    else:
        raise SystemExit(f"kernel_without: expected landlock or seccomp, not {without!r}")
    code += [
        ("label", "allow"),
        (S._RET_K, 0, 0, S._RET_ALLOW),
        ("label", "prctl"),
        (S._LD_W_ABS, 0, 0, S._arg(0)),
        (S._JEQ_K, 0, "allow2", _PR_SET_SECCOMP),
        (S._RET_K, 0, 0, S._RET_ERRNO | errno.EINVAL),
        ("label", "allow2"),
        (S._RET_K, 0, 0, S._RET_ALLOW),
        ("label", "enosys"),
        (S._RET_K, 0, 0, S._RET_ERRNO | errno.ENOSYS),
    ]
    return S._assemble(code)


def install(without: str) -> None:
    prog = program(without)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = S._SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(S._PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
        S._PR_SET_SECCOMP, S._SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0
    ):
        raise SystemExit(f"kernel_without: cannot install the filter: {os.strerror(ctypes.get_errno())}")


if __name__ == "__main__":
    install(sys.argv[1])
    os.execv(sys.argv[2], sys.argv[2:])
