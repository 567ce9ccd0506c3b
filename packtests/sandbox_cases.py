"""A fix's process trying to change what it did not declare, by ways a Python audit hook cannot see.

Each case is a codemod that calls libc through ctypes (no audit event names the path) to write
a file of the tree outside its targets, change its metadata, or start a program. Run twice:

  landlock   the kernel refuses the call (Landlock, or the seccomp filter for metadata): the fix
             fails with the errno, nothing changed
  hook       Landlock forced off (FIXPACK_SANDBOX=hook): the call succeeds, and the driver's
             snapshot check finds the change, undoes it and fails the fix naming the file; or,
             for a call that needs a privilege (chown to another user), the dropped
             capabilities refuse it (``hook="refused"``)

Shared by tests/integration/test_sandbox.py and bench/reliability_report.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from packtests import builders as B
from packtests import reliability_lib as L
from packtests.hostile_cases import Ctx

# Every case gets these names: libc, fail() (raise the errno), T (the tree), S (the staging folder, the cwd).
PRELUDE = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
T = os.environ['FIXPACK_TEST_TREE'].encode()
S = os.getcwd().encode()
def fresh(name):  # a name left by an earlier run of the same case
    libc.unlink(name.encode())
def fail(what):
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e), what)
"""


@dataclass
class Escape:
    id: str
    what: str
    body: str  # the rest of the codemod's handler; it must change the tree if the kernel lets it
    file: str  # the tree file it changes (relative), named in the detection message
    # with Landlock forced off: "caught" by the snapshot, or "refused" (the capabilities are
    # dropped and the privileged-call filter installed in every mode)
    hook: str = "caught"


ESCAPES = [
    Escape(
        "hard-link",
        "hard-link an undeclared tree file into the stage, then write the staged name",
        "if libc.link(T + b'/pkg_a/__init__.py', S + b'/h') != 0: fail('link')\nopen('h', 'a').write('# pwned\\n')",
        "pkg_a/__init__.py",
    ),
    Escape(
        "dir-fd",
        "open an undeclared file for writing relative to a folder descriptor opened in the tree",
        "d = os.open(T + b'/pkg_a', os.O_RDONLY | os.O_DIRECTORY)\nfd = libc.openat(d, b'__init__.py', os.O_WRONLY | os.O_APPEND)\nif fd < 0: fail('openat')\nos.write(fd, b'# pwned\\n')",
        "pkg_a/__init__.py",
    ),
    Escape(
        "rename-target-into-stage",
        "move its own target out of the tree into the stage",
        "if libc.rename(T + b'/pkg_a/sub/other.py', S + b'/moved') != 0: fail('rename')",
        "pkg_a/sub/other.py",
    ),
    Escape(
        "symlink-in-stage",
        "plant a symlink in the stage pointing at a tree file and write through it",
        "fresh('l')\nif libc.symlink(T + b'/pkg_a/__init__.py', S + b'/l') != 0: fail('symlink')\nfd = libc.open(S + b'/l', os.O_WRONLY | os.O_APPEND)\nif fd < 0: fail('open through the symlink')\nos.write(fd, b'# pwned\\n')",
        "pkg_a/__init__.py",
    ),
    Escape(
        "proc-self-fd",
        "reopen a read-only descriptor of a tree file for writing through /proc/self/fd",
        "r = os.open(T + b'/pkg_a/__init__.py', os.O_RDONLY)\nfd = libc.open(b'/proc/self/fd/%d' % r, os.O_WRONLY | os.O_APPEND)\nif fd < 0: fail('open /proc/self/fd')\nos.write(fd, b'# pwned\\n')",
        "pkg_a/__init__.py",
    ),
    Escape(
        "replace-onto-target",
        "write a file in the stage and rename it over its target in the tree",
        "open('new', 'w').write('pwned = True\\n')\nif libc.rename(S + b'/new', T + b'/pkg_a/sub/other.py') != 0: fail('rename over the target')",
        "pkg_a/sub/other.py",
    ),
    Escape(
        "truncate-undeclared",
        "truncate a file it does not declare",
        "if libc.truncate(T + b'/pkg_a/mod.py', ctypes.c_long(0)) != 0: fail('truncate')",
        "pkg_a/mod.py",
    ),
    Escape(
        "exec-program",
        "replace its process by a shell that writes a tree file",
        "sh = b'/bin/sh'\nargv = (ctypes.c_char_p * 4)(sh, b'-c', b'echo pwned >> ' + T + b'/pkg_a/__init__.py', None)\nlibc.execv(sh, argv)\nfail('execv')",
        "pkg_a/__init__.py",
    ),
    # Landlock does not govern metadata; the seccomp filter refuses these
    Escape(
        "chmod-undeclared",
        "make a file it does not declare world-writable",
        "if libc.chmod(T + b'/pkg_a/mod.py', 0o777) != 0: fail('chmod')",
        "pkg_a/mod.py",
    ),
    Escape(
        "chown-undeclared",
        "give a file it does not declare to another user",
        "if libc.chown(T + b'/pkg_a/mod.py', 1, 1) != 0: fail('chown')",
        "pkg_a/mod.py",
        hook="refused",
    ),
    Escape(
        "utimes-undeclared",
        "move the modification time of a file it does not declare",
        "if libc.utimes(T + b'/pkg_a/mod.py', None) != 0: fail('utimes')",
        "pkg_a/mod.py",
    ),
    # privilege and other processes. Refused with Landlock and without
    # (no capabilities, and the privileged-call filter, in every mode). The device made is
    # /dev/null's (1, 3): harmless had it been allowed; a real attack would use a disk's.
    Escape(
        "mknod-device",
        "make a device node in its own stage (to write a disk through it)",
        "if libc.mknod(S + b'/dev', 0o20600, ctypes.c_ulong(os.makedev(1, 3))) != 0: fail('mknod')",
        "",
        hook="refused",
    ),
    Escape(
        "mknod-fifo",
        "make a FIFO in its own stage",
        "if libc.mkfifo(S + b'/fifo', 0o600) != 0: fail('mkfifo')",
        "",
        hook="refused",
    ),
    Escape(
        "prlimit-driver",
        "set the file size and open file limits of the driver and the fork server",
        "srv = os.getppid()\ndrv = int(open(f'/proc/{srv}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "import resource\nfor pid in (drv, srv):\n    resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, 0))\n"
        "    resource.prlimit(pid, resource.RLIMIT_NOFILE, (11, 11))",
        "",
        hook="refused",
    ),
    Escape(
        "setpriority-driver",
        "renice the driver, then every process of its user",
        "if libc.setpriority(0, os.getppid(), 19) != 0 and libc.setpriority(2, 0, 19) != 0: fail('setpriority')",
        "",
        hook="refused",
    ),
    Escape(
        "sched-driver",
        "move the driver to another scheduler",
        "p = ctypes.c_int(0)\nif libc.sched_setscheduler(os.getppid(), 5, ctypes.byref(p)) != 0: fail('sched_setscheduler')",
        "",
        hook="refused",
    ),
    Escape(
        "netlink-socket",
        "open a netlink socket (routes, audit, uevents)",
        "if libc.socket(16, 3, 0) < 0: fail('socket(AF_NETLINK)')",
        "",
        hook="refused",
    ),
    Escape(
        "raw-socket",
        "open a raw IP socket",
        "if libc.socket(2, 3, 1) < 0: fail('socket(SOCK_RAW)')",
        "",
        hook="refused",
    ),
    Escape(
        "load-module",
        "load a kernel module (an empty one: EBADF had it been allowed)",
        "import platform\nfrom fixpack.sandbox.seccomp import _ARCH\nnr = _ARCH[platform.machine()][3]['finit_module']\n"
        "if libc.syscall(nr, -1, b'', 0) != 0 and ctypes.get_errno() != errno.EBADF: fail('finit_module')\n"
        "raise OSError(errno.EBADF, 'finit_module was allowed')",
        "",
        hook="refused",
    ),
    Escape(
        "fork-setsid",
        "start a process that leaves its group (setsid) and outlives the run",
        "pid = libc.fork()\nif pid < 0: fail('fork')\nif pid == 0:\n    libc.setsid()\n    import time\n    time.sleep(2)\n"
        "    open(os.environ['FIXPACK_TEST_TREE'] + '/../outside/pwned', 'w').write('survived')\n    os._exit(0)",
        "",
        hook="refused",
    ),
]

KERNEL_MSG = r"refused by the kernel \(Landlock ABI \d+( \+ seccomp)?\): (PermissionError|OSError): \[Errno (13|18|1)\]"
HOOK_REFUSED_MSG = r"refused by the kernel \(seccomp, no capabilities\): (PermissionError|OSError): \[Errno 1\]"
DETECT_MSG = r"fix fix-two changed \S*{file} outside its targets.*every change it made was undone"


def run_escape(esc: Escape, mode: str, work: Path):
    """Run one case under one mode; raises AssertionError unless it is refused or caught and undone."""
    work.mkdir(parents=True, exist_ok=True)
    root, tree = L.copy_pack("codemod-first", work)
    ctx = Ctx(root, tree, work / "outside", work / "outside" / "pwned")
    ctx.outside.mkdir()
    decoy = ctx.outside / "decoy.py"  # outside the tree: nothing may change it
    decoy.write_text("decoy = 1\n")
    decoy_before = (decoy.read_bytes(), decoy.stat().st_mode, decoy.stat().st_mtime_ns)
    ctx.codemod(PRELUDE.strip("\n") + "\n" + esc.body + "\nreturn node")
    B.forge_lock(root, "fix-two")
    before = B.tree_digest(tree)
    r = B.fixpack(
        "apply",
        "--profile",
        "test",
        "--root",
        str(tree),
        pack=root,
        env={"FIXPACK_TEST_TREE": str(tree), "FIXPACK_SANDBOX": "landlock" if mode == "landlock" else "hook"},
    )
    out = r.stdout + r.stderr
    assert r.returncode == 4, f"{esc.id}/{mode}: exit {r.returncode}, expected 4:\n{out[-2500:]}"
    if mode == "landlock":
        want = KERNEL_MSG
    else:
        want = HOOK_REFUSED_MSG if esc.hook == "refused" else DETECT_MSG.format(file=re.escape(esc.file))
    assert re.search(want, out, re.S), f"{esc.id}/{mode}: no {want!r} in:\n{out[-2500:]}"
    assert re.search("nothing (of this fix )?was written", out), out[-2500:]
    assert B.tree_digest(tree) == before, f"{esc.id}/{mode}: the tree was left changed"
    assert not any(p.name in ("h", "l", "moved", "new") for p in tree.rglob("*")), (
        f"{esc.id}/{mode}: a file was left in the tree"
    )
    assert (decoy.read_bytes(), decoy.stat().st_mode, decoy.stat().st_mtime_ns) == decoy_before, (
        f"{esc.id}/{mode}: the decoy outside the tree changed"
    )
    assert sorted(p.name for p in ctx.outside.iterdir()) == ["decoy.py"], (
        f"{esc.id}/{mode}: a file appeared outside the tree"
    )
    assert (
        not (tree / ".fixpack" / "state.json").exists()
        or "fix-two" not in (tree / ".fixpack" / "state.json").read_text()
    )
    return r


def landlock_here() -> str | None:
    """None when the kernel can confine a process here, else why not."""
    from fixpack.sandbox.landlock import Unavailable, abi_version

    try:
        abi_version()
        return None
    except Unavailable as exc:
        return str(exc)


__all__ = ["ESCAPES", "run_escape", "landlock_here", "os"]
