"""Resource limits on a fix's process: address space, file size, open files, processes, CPU time.

Set in the fix's process before it drops its capabilities (fixpack.sandbox.privilege), so that it can
never raise them again. ``FIXPACK_LIMITS`` overrides any of them, as ``name=value`` pairs
separated by commas (``FIXPACK_LIMITS=as=16G,cpu=600``); sizes take K, M or G.

The defaults leave every fix of the pack room: a cold apply of the v0.26.0 profile (19 fixes,
real targets) passes with ``as=256M,cpu=2,nofile=16,fsize=1M``, its largest fix process peaking
at 37 MiB resident and 0.09 s of CPU (measured on 2 CPUs; each default is 16 times the setting
that passed or more; the v0.30.0 sources were not reachable there). When a limit is reached,
the kernel answers the process (MemoryError, EFBIG, EMFILE, EAGAIN) or ends it (SIGXCPU, then
SIGKILL at the hard CPU limit), and the driver reports "fix X exceeded LIMIT".

RLIMIT_NPROC counts every process and thread of the user, and the kernel does not apply it to
root at all: the seccomp filter (fixpack.sandbox.seccomp) is what keeps a fix from starting any
process; this limit bounds threads (and processes where the filter is missing) for another uid.
"""

from __future__ import annotations

import resource

from fixpack.errors import ConfigError

# name -> (resource, default, what it is called in a message)
LIMITS = {
    "as": (resource.RLIMIT_AS, 8 << 30, "address space limit"),
    "fsize": (resource.RLIMIT_FSIZE, 256 << 20, "file size limit"),
    "nofile": (resource.RLIMIT_NOFILE, 256, "open files limit"),
    "nproc": (resource.RLIMIT_NPROC, 4096, "process limit"),
    "cpu": (resource.RLIMIT_CPU, 300, "CPU time limit"),
}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
CPU_GRACE = 5  # seconds between SIGXCPU (soft) and SIGKILL (hard)


def parse(text: str | None) -> dict[str, int]:
    """The limits in force: the defaults, with ``text`` (FIXPACK_LIMITS) over them."""
    out = {name: spec[1] for name, spec in LIMITS.items()}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, eq, value = item.strip().partition("=")
        if name not in LIMITS or not eq:
            raise ConfigError(
                f"FIXPACK_LIMITS: {item.strip()!r}: expected NAME=VALUE with NAME one of {', '.join(LIMITS)}"
            )
        unit = value[-1:].upper() if value[-1:].upper() in "KMG" else ""
        digits = value[: len(value) - len(unit)]
        if not digits.isdigit() or int(digits) <= 0 or (unit and name in ("nofile", "nproc", "cpu")):
            raise ConfigError(
                f"FIXPACK_LIMITS: {name}={value}: expected a positive whole number"
                + ("" if name in ("nofile", "nproc", "cpu") else " (K, M or G allowed)")
            )
        out[name] = int(digits) * _UNITS[unit]
    return out


def show(name: str, value: int) -> str:
    if name in ("as", "fsize"):
        for unit in ("G", "M", "K"):
            if value % _UNITS[unit] == 0:
                return f"{name}={value // _UNITS[unit]}{unit}"
    return f"{name}={value}"


def apply(limits: dict[str, int]) -> None:
    """Set the limits on this process (a fix's, before it loads the fix). A hard limit already
    lower than asked is kept (it cannot be raised without privilege, and need not be)."""
    for name, value in limits.items():
        res = LIMITS[name][0]
        _, hard = resource.getrlimit(res)
        soft = value
        new_hard = value + CPU_GRACE if name == "cpu" else value
        if hard != resource.RLIM_INFINITY:
            soft, new_hard = min(soft, hard), min(new_hard, hard)
        resource.setrlimit(res, (soft, new_hard))


def exceeded(
    limits: dict[str, int],
    *,
    error: str = "",
    errno_: int | None = None,
    signal_: int | None = None,
    cpu_s: float = 0.0,
) -> str | None:
    """Which limit a failed fix's process ran into, from what it reported or how it ended."""
    import errno
    import signal

    name = None
    if signal_ in (signal.SIGXCPU,) or (signal_ == signal.SIGKILL and cpu_s >= limits["cpu"]):
        name = "cpu"
    elif signal_ == signal.SIGXFSZ or errno_ == errno.EFBIG:
        name = "fsize"
    elif errno_ in (errno.EMFILE,):
        name = "nofile"
    elif error.startswith("MemoryError"):
        name = "as"
    elif errno_ == errno.EAGAIN or "can't start new thread" in error:
        name = "nproc"
    if name is None:
        return None
    return f"{LIMITS[name][2]} ({show(name, limits[name])}; FIXPACK_LIMITS sets it)"
