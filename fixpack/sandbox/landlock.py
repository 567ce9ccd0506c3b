"""Kernel confinement of a fix's process with Landlock (Linux 5.13 and later).

A fix's process may read anything, and may write, create, link, rename, truncate or remove
only beneath its staging folder (regular files, folders and symlinks: no device node, FIFO or
socket, there either); it may execute no program, bind or connect no TCP socket
(ABI 4) and signal no process outside its own sandbox (ABI 6). The rules bind the process
and every process it makes, and cannot be lifted from inside: unlike the audit hook, they
also hold against ctypes, ``dir_fd`` names, hard links and ``/proc/self/fd`` reopening.

The three system calls are made directly through ctypes rather than through the ``landlock``
binding on PyPI: it is about sixty lines, adds no dependency to an inference image, and
keeps the access rights of each ABI (truncate, refer, ioctl, network, scopes) in our hands.
"""

from __future__ import annotations

import ctypes
import os
import platform

# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the same numbers on
# every architecture that has them (the shared system call table, from Linux 5.13).
_NR = (444, 445, 446)
_ARCHES = {"x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "s390x", "loongarch64"}
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem access rights and the ABI that introduced each.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class Unavailable(OSError):
    """Landlock cannot confine this process (old kernel, disabled, filtered by seccomp)."""


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:  # once per fork server: every child inherits it
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.syscall.restype = ctypes.c_long
    return _LIBC


def abi_version() -> int:
    """The kernel's Landlock ABI; raises Unavailable with the reason when there is none."""
    if platform.system() != "Linux":
        raise Unavailable(f"Landlock is a Linux feature; this is {platform.system()}")
    if platform.machine() not in _ARCHES:
        raise Unavailable(f"Landlock system call numbers unknown for {platform.machine()}")
    libc = _libc()
    abi = libc.syscall(_NR[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if abi < 0:
        err = ctypes.get_errno()
        why = {38: "the kernel has no Landlock (ENOSYS: older than 5.13, or a seccomp filter hides it)",
               95: "Landlock is built in but disabled (EOPNOTSUPP: not in the lsm= boot list)",
               1: "a seccomp filter refuses the Landlock system calls (EPERM)"}.get(err, os.strerror(err))
        raise Unavailable(err, why)
    return int(abi)


def confine(write_dir: str) -> int:
    """Restrict this process (and its future children) for good; returns the ABI in force."""
    abi = abi_version()
    fs = _FS_BY_ABI[max(k for k in _FS_BY_ABI if k <= abi)]
    handled_fs = fs & ~(READ_FILE | READ_DIR)  # reads stay free: a fix reads its inputs and Python's modules
    attr = _RulesetAttr(handled_fs, (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
                        (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    libc = _libc()
    ruleset = libc.syscall(_NR[0], ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        err = ctypes.get_errno()
        raise Unavailable(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        fd = os.open(write_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # beneath the stage: files and folders, never a program, a device node, a FIFO or a socket
            rule = _PathBeneathAttr(handled_fs & ~(EXECUTE | IOCTL_DEV | MAKE_CHAR | MAKE_BLOCK | MAKE_FIFO | MAKE_SOCK), fd)
            if libc.syscall(_NR[1], ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                err = ctypes.get_errno()
                raise Unavailable(err, f"landlock_add_rule({write_dir}): {os.strerror(err)}")
        finally:
            os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise Unavailable(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        if libc.syscall(_NR[2], ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            err = ctypes.get_errno()
            raise Unavailable(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)
    return abi
