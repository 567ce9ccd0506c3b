"""The seccomp filter on a fix's process: no metadata change, no privileged or cross-process call.

Landlock (fixpack.sandbox.landlock) keeps a fix's writes, links, renames and truncations inside its
staging folder, but it does not govern metadata: mode, owner, times and extended attributes
can still be changed anywhere the process's user may. The metadata part of this filter closes
that gap, so that with both in force the kernel alone guarantees that a fix's process changes
nothing outside its stage, and the driver can check the trees once per run instead of after
every fix. It is installed with Landlock only: without Landlock (``FIXPACK_SANDBOX=hook``, or a
kernel without it) the driver's snapshot is what finds such a change, and the tests show it.

The privilege part is installed in every mode (it needs seccomp only, not Landlock): a fix
computes text, so it needs no device node, no other process's limits or priority, no kernel
module, mount, key, BPF program, perf counter, netlink or raw socket, and no new process.
Refused with EPERM (fixpack.sandbox.privilege drops the capabilities too; this holds for what the
process's uid may do without any, such as ``prlimit`` on another root process):

* whole: mknod/mknodat, ptrace, process_vm_readv/writev, pidfd_getfd, kcmp, kexec_load,
  kexec_file_load, init_module/finit_module/delete_module, reboot, mount, umount2, pivot_root,
  the new mount calls (open_tree ... mount_setattr), swapon/swapoff, bpf, perf_event_open,
  userfaultfd, keyctl/add_key/request_key, unshare, setns, open_by_handle_at, acct, the clock
  and host name calls, quotactl, syslog, io_uring_setup/enter/register (a ring's requests are
  system calls this filter never sees: refused in every mode, Landlock or not); x86_64's fork,
  vfork, iopl, ioperm.
* by argument: prlimit64, sched_setparam, sched_setscheduler, sched_setaffinity and
  sched_setattr only on pid 0 (this process); setpriority only (PRIO_PROCESS, 0) and
  ioprio_set only (IOPRIO_WHO_PROCESS, 0); clone only with CLONE_THREAD (a thread, not a
  process); socket never for AF_NETLINK or AF_PACKET, nor of type SOCK_RAW or SOCK_PACKET.
  clone3 answers ENOSYS: its flags are in memory, which a filter cannot read, and the C
  library then falls back to clone, whose flags it can.

Where a whole call cannot be refused: the pid calls take "this process" as 0, and a filter
compares an argument with constants only, never with the caller's own pid, so they are allowed
for 0 and refused for every other number (the fix's own pid too; a fix needs neither).
setrlimit (always this process) stays allowed: a fix may lower its own limits, and without
CAP_SYS_RESOURCE it cannot raise a hard one. An int argument is compared on its low 32 bits,
the bits the kernel reads.

A call from another system call table (x86's 32-bit or x32 tables) is refused whole. The
program is a classic BPF filter written out by hand through ctypes, as fixpack.sandbox.landlock makes
its system calls: no dependency, and the numbers of each architecture in one table
(tests/unit/test_seccomp.py runs the program in a small interpreter for every architecture listed).
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
    "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466,
}
_AARCH64 = {
    "fchmod": 52, "fchmodat": 53, "fchownat": 54, "fchown": 55, "utimensat": 88, "fchmodat2": 452,
    "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
    "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466,
}
# The privileged or cross-process calls refused whole, per architecture.
_X86_64_PRIV = {
    "mknod": 133, "mknodat": 259, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "pidfd_getfd": 438, "kcmp": 312, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
    "finit_module": 313, "delete_module": 176, "reboot": 169, "mount": 165, "umount2": 166,
    "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "swapon": 167, "swapoff": 168, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "unshare": 272, "setns": 308, "open_by_handle_at": 304, "acct": 163, "settimeofday": 164,
    "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305, "sethostname": 170,
    "setdomainname": 171, "quotactl": 179, "syslog": 103, "fork": 57, "vfork": 58, "iopl": 172,
    "ioperm": 173, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
}
_AARCH64_PRIV = {
    "mknodat": 33, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
    "pidfd_getfd": 438, "kcmp": 272, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "reboot": 142, "mount": 40, "umount2": 39,
    "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "swapon": 224, "swapoff": 225, "bpf": 280,
    "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
    "unshare": 97, "setns": 268, "open_by_handle_at": 265, "acct": 89, "settimeofday": 170,
    "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266, "sethostname": 161,
    "setdomainname": 162, "quotactl": 60, "syslog": 116, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427,
}
# The calls allowed only for some arguments: name -> number, per architecture.
_X86_64_ARGS = {"prlimit64": 302, "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
                "sched_setattr": 314, "setpriority": 141, "ioprio_set": 251, "clone": 56, "socket": 41, "clone3": 435}
_AARCH64_ARGS = {"prlimit64": 261, "sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
                 "sched_setattr": 274, "setpriority": 140, "ioprio_set": 30, "clone": 220, "socket": 198, "clone3": 435}
# machine -> (AUDIT_ARCH value, ioctl's number, metadata calls, privileged calls, argument-checked calls, x32 bit or 0)
_ARCH = {
    "x86_64": (0xC000003E, 16, _X86_64, _X86_64_PRIV, _X86_64_ARGS, 0x40000000),
    "aarch64": (0xC00000B7, 29, _AARCH64, _AARCH64_PRIV, _AARCH64_ARGS, 0),
    "arm64": (0xC00000B7, 29, _AARCH64, _AARCH64_PRIV, _AARCH64_ARGS, 0),
}
# FS_IOC_SETFLAGS (chattr +i, +a) and FS_IOC_FSSETXATTR (project id, flags), as _IOW numbers.
_IOCTLS = (0x40086602, 0x401C5820)
_CLONE_THREAD = 0x00010000
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1
_AF_NETLINK, _AF_PACKET, _SOCK_RAW, _SOCK_PACKET, _SOCK_TYPE_MASK = 16, 17, 3, 10, 0xF

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _ALU_AND_K, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x54, 0x15, 0x35, 0x45, 0x06
# offsets in struct seccomp_data: nr, arch, instruction pointer, then six 64-bit arguments;
# the low word of argument i is at 16 + 8 * i on a little-endian machine (both listed here)
_OFF_NR, _OFF_ARCH = 0, 4


def _arg(i: int) -> int:
    return 16 + 8 * i


class Unavailable(OSError):
    """The filter cannot be installed here (another architecture, no seccomp, refused)."""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _assemble(code: list[tuple]) -> list[tuple[int, int, int, int]]:
    """Resolve labels: ``code`` holds ("label", name) markers and (op, jt, jf, k) instructions
    whose jt/jf are a label name or 0 (the next instruction)."""
    at: dict[str, int] = {}
    n = 0
    for ins in code:
        if ins[0] == "label":
            at[ins[1]] = n
        else:
            n += 1
    prog: list[tuple[int, int, int, int]] = []
    for ins in code:
        if ins[0] == "label":
            continue
        op, jt, jf, k = ins
        here = len(prog) + 1
        jt = at[jt] - here if isinstance(jt, str) else jt
        jf = at[jf] - here if isinstance(jf, str) else jf
        if not (0 <= jt < 256 and 0 <= jf < 256):  # classic BPF jumps forward only, by at most 255
            raise AssertionError(f"seccomp program: jump out of range in {op:#x} at {here - 1}")
        prog.append((op, jt, jf, k))
    return prog


def _program(machine: str, metadata: bool = True) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, k) instructions: the privileged calls
    always, the metadata calls when ``metadata``."""
    arch, ioctl_nr, meta, priv, args, x32_bit = _ARCH[machine]
    whole = sorted(set(priv.values()) | (set(meta.values()) if metadata else set()))
    code: list[tuple] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 0, "deny", arch),  # a call through another table is refused whole
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if x32_bit:
        code.append((_JGE_K, "deny", 0, x32_bit))
    code += [(_JEQ_K, "deny", 0, n) for n in whole]
    code += [(_JEQ_K, name, 0, nr) for name, nr in sorted(args.items(), key=lambda kv: kv[1])]
    if metadata:
        code.append((_JEQ_K, "ioctl", 0, ioctl_nr))
    code.append((_RET_K, 0, 0, _RET_ALLOW))
    if metadata:  # ioctl: refuse the inode-flag requests, allow the rest (a terminal's, say)
        code += [("label", "ioctl"), (_LD_W_ABS, 0, 0, _arg(1))]
        code += [(_JEQ_K, "deny", 0, cmd) for cmd in _IOCTLS]
        code.append((_RET_K, 0, 0, _RET_ALLOW))

    def only(name: str, *values: int) -> None:
        """``name`` is allowed when its first arguments equal ``values``, refused otherwise."""
        code.append(("label", name))
        for i, v in enumerate(values):
            code.extend([(_LD_W_ABS, 0, 0, _arg(i)), (_JEQ_K, 0, "deny", v)])
        code.append((_RET_K, 0, 0, _RET_ALLOW))

    for name in ("prlimit64", "sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr"):
        only(name, 0)  # pid 0: this process
    only("setpriority", _PRIO_PROCESS, 0)
    only("ioprio_set", _IOPRIO_WHO_PROCESS, 0)
    code += [
        ("label", "clone"),  # a thread shares the process; anything else is a new process
        (_LD_W_ABS, 0, 0, _arg(0)),
        (_JSET_K, 0, "deny", _CLONE_THREAD),
        (_RET_K, 0, 0, _RET_ALLOW),
        ("label", "clone3"),
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        ("label", "socket"),
        (_LD_W_ABS, 0, 0, _arg(0)),
        (_JEQ_K, "deny", 0, _AF_NETLINK),
        (_JEQ_K, "deny", 0, _AF_PACKET),
        (_LD_W_ABS, 0, 0, _arg(1)),
        (_ALU_AND_K, 0, 0, _SOCK_TYPE_MASK),  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC
        (_JEQ_K, "deny", 0, _SOCK_RAW),
        (_JEQ_K, "deny", 0, _SOCK_PACKET),
        (_RET_K, 0, 0, _RET_ALLOW),
        ("label", "deny"),
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
    ]
    return _assemble(code)


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() in _ARCH


def install(metadata: bool) -> list[str]:
    """Install the filter on this process for good (its children inherit it): the privileged
    calls always, the metadata calls when ``metadata``; returns the names of what it refuses.
    Needs no privilege: sets no_new_privs first, as Landlock does."""
    if platform.system() != "Linux":
        raise Unavailable(f"seccomp is a Linux feature; this is {platform.system()}")
    machine = platform.machine()
    if machine not in _ARCH:
        raise Unavailable(f"system call numbers unknown for {machine}")
    prog = _program(machine, metadata)
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
    _, _, meta, priv, args, _ = _ARCH[machine]
    return sorted(priv) + sorted(args) + (sorted(meta) + ["ioctl FS_IOC_SETFLAGS/FS_IOC_FSSETXATTR"] if metadata else []) + ["other system call tables"]


def deny_metadata_changes() -> list[str]:
    """The whole filter (with Landlock): metadata and privileged calls."""
    return install(metadata=True)
