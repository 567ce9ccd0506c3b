"""A seccomp filter that refuses a fix's process every call that changes a file's metadata.

Landlock (fixpack.landlock) keeps a fix's writes, links, renames and truncations inside its
staging folder, but it does not govern metadata: mode, owner, times and extended attributes
can still be changed anywhere the process's user may. This filter closes that gap, so that
with both in force the kernel alone guarantees that a fix's process changes nothing outside
its stage, and the driver can check the trees once per run instead of after every fix.

Refused with EPERM, everywhere (a fix computes text; it never needs them, in its stage either):
chmod and chown in all their forms, utime/utimes/futimesat/utimensat, set/remove xattr in all
their forms, the inode-flag ioctls (``chattr``), and io_uring (whose requests the filter does
not see). A call from another system call table (x86's 32-bit or x32 tables) is refused whole.

The program is a classic BPF filter written out by hand through ctypes, as fixpack.landlock
makes its system calls: no dependency, and the numbers of each architecture in one table.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# The calls that change metadata, per architecture. aarch64 (the generic table) has only the
# *at forms and the f* forms; x86_64 keeps the old path forms too.
_X86_64 = {
    "chmod": 90, "fchmod": 91, "chown": 92, "fchown": 93, "lchown": 94, "utime": 132, "utimes": 235,
    "fchownat": 260, "futimesat": 261, "fchmodat": 268, "utimensat": 280, "fchmodat2": 452,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
    "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466, "io_uring_setup": 425,
}
_AARCH64 = {
    "fchmod": 52, "fchmodat": 53, "fchownat": 54, "fchown": 55, "utimensat": 88, "fchmodat2": 452,
    "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
    "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466, "io_uring_setup": 425,
}
# machine -> (AUDIT_ARCH value the kernel reports, ioctl's number, metadata calls, x32 bit or 0)
_ARCH = {
    "x86_64": (0xC000003E, 16, _X86_64, 0x40000000),
    "aarch64": (0xC00000B7, 29, _AARCH64, 0),
    "arm64": (0xC00000B7, 29, _AARCH64, 0),
}
# FS_IOC_SETFLAGS (chattr +i, +a) and FS_IOC_FSSETXATTR (project id, flags), as _IOW numbers.
_IOCTLS = (0x40086602, 0x401C5820)

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
# offsets in struct seccomp_data: nr, arch, instruction pointer, then six 64-bit arguments
_OFF_NR, _OFF_ARCH, _OFF_ARG1_LOW = 0, 4, 24


class Unavailable(OSError):
    """The filter cannot be installed here (another architecture, no seccomp, refused)."""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, k) instructions."""
    arch, ioctl_nr, calls, x32_bit = _ARCH[machine]
    numbers = sorted(set(calls.values()))
    deny_errno = _RET_ERRNO | errno.EPERM
    # Layout: the checks; ret allow; the ioctl check (load its request, compare, ret allow); ret
    # deny. Classic BPF jumps only forward, so every check jumps down to one of these labels.
    allow_at = 3 + (1 if x32_bit else 0) + len(numbers) + 1
    ioctl_at = allow_at + 1
    deny_at = ioctl_at + 1 + len(_IOCTLS) + 1
    prog: list[tuple[int, int, int, int]] = []

    def to(target: int) -> int:
        return target - len(prog) - 1

    prog.append((_LD_W_ABS, 0, 0, _OFF_ARCH))
    prog.append((_JEQ_K, 0, to(deny_at), arch))  # a call through another table is refused whole
    prog.append((_LD_W_ABS, 0, 0, _OFF_NR))
    if x32_bit:
        prog.append((_JGE_K, to(deny_at), 0, x32_bit))
    for n in numbers:
        prog.append((_JEQ_K, to(deny_at), 0, n))
    prog.append((_JEQ_K, to(ioctl_at), 0, ioctl_nr))
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    # ioctl: refuse the inode-flag requests, allow the rest (a terminal's, say)
    prog.append((_LD_W_ABS, 0, 0, _OFF_ARG1_LOW))
    for cmd in _IOCTLS:
        prog.append((_JEQ_K, to(deny_at), 0, cmd))
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    assert len(prog) == deny_at, (len(prog), deny_at)
    prog.append((_RET_K, 0, 0, deny_errno))
    for code, jt, jf, _ in prog:
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise AssertionError(f"seccomp program: jump out of range in {code:#x}")
    return prog


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() in _ARCH


def deny_metadata_changes() -> list[str]:
    """Install the filter on this process for good (its children inherit it); returns the names
    of the calls it refuses. Needs no privilege: sets no_new_privs first, as Landlock does."""
    if platform.system() != "Linux":
        raise Unavailable(f"seccomp is a Linux feature; this is {platform.system()}")
    machine = platform.machine()
    if machine not in _ARCH:
        raise Unavailable(f"metadata system call numbers unknown for {machine}")
    prog = _program(machine)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise Unavailable(err, f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(err, err)}")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        why = {errno.EINVAL: "the kernel has no seccomp filter mode (EINVAL)", errno.EACCES: "refused (EACCES)"}.get(err, errno.errorcode.get(err, str(err)))
        raise Unavailable(err, f"prctl(PR_SET_SECCOMP): {why}")
    return sorted(_ARCH[machine][2]) + ["ioctl FS_IOC_SETFLAGS/FS_IOC_FSSETXATTR", "other system call tables"]
