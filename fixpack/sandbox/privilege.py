"""A fix's process gives up every privilege before the fix is loaded.

fixpack usually runs as root (it writes into an image's site-packages), and a forked child keeps
root's capabilities: with them a fix could make device nodes, load modules, reboot, or read and
write past every file's mode. The child drops them all, in every set (bounding, then ambient,
then effective, permitted and inheritable), locks the securebits so that uid 0 cannot get them
back (no capabilities on exec, none kept across a uid change), and sets no_new_privs, so that
no exec (of a setuid or file-capability program) grants any. The uid stays what it is: the fix
still owns what the driver's user owns, which is why Landlock (fixpack.sandbox.landlock) and the seccomp
filter (fixpack.sandbox.seccomp) remain the walls; this takes away what a uid alone does not give.

Made through ctypes (prctl, capset), as fixpack.sandbox.landlock makes its calls: no dependency.
"""

from __future__ import annotations

import ctypes
import errno
import os

_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 24, 28, 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_SETPCAP = 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each with its lock, and KEEP_CAPS locked off
_SECUREBITS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7)
_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def capability_sets() -> dict[str, int]:
    """This process's capability sets, from /proc/self/status (CapInh ... CapAmb -> bits)."""
    out: dict[str, int] = {}
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Cap"):
                name, _, value = line.decode().partition(":")
                if name in _SETS:
                    out[name] = int(value.strip(), 16)
    return out


def drop_all() -> dict:
    """Drop every capability of this process for good and set no_new_privs. Returns what holds
    now, for the state record; raises PermissionError naming the set that kept a capability."""
    libc = ctypes.CDLL(None, use_errno=True)
    have = capability_sets()
    if have.get("CapEff", 0) & (1 << _CAP_SETPCAP):
        # the bounding set and the securebits need CAP_SETPCAP: first, while it is still held
        last = _last_cap()
        for cap in range(last + 1):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                err = ctypes.get_errno()
                if err == errno.EINVAL and cap > 0:
                    break  # past the kernel's last capability (cap_last_cap unreadable)
                raise PermissionError(err, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}")
        if libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise PermissionError(err, f"prctl(PR_SET_SECUREBITS): {os.strerror(err)}")
    # ambient: EINVAL on a kernel older than 4.3, which has no ambient set to clear
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()  # all zero: effective, permitted and inheritable emptied
    if libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
        err = ctypes.get_errno()
        raise PermissionError(err, f"capset: {os.strerror(err)}")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise PermissionError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    now = capability_sets()
    kept = [name for name in ("CapInh", "CapPrm", "CapEff", "CapAmb") if now.get(name)]
    if kept:
        raise PermissionError(
            f"the fix's process still holds capabilities after dropping them ({', '.join(f'{k}={now[k]:#x}' for k in kept)})"
        )
    if now.get("CapBnd"):
        # not root: the bounding set cannot be emptied without CAP_SETPCAP, and with nothing
        # held and no_new_privs set, no exec can take anything from it
        return {"capabilities": "none", "bounding": f"{now['CapBnd']:#x} kept (no CAP_SETPCAP; no_new_privs set)"}
    return {"capabilities": "none"}


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63  # dropping a number the kernel does not know fails: stop there
