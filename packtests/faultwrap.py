#!/usr/bin/env python3
"""Run the fixpack CLI with injected faults. A test helper, not part of fixpack.

    PYTHONPATH=<repo> python -m packtests.faultwrap <fixpack arguments...>

Faults come from the environment, so a test starts fixpack exactly as a user does, in its
own process, with one thing going wrong:

  FAULT_ERRNO_AT=N:ERRNO     the N-th os.write to a regular file raises OSError(ERRNO)
                             (28 ENOSPC, 30 EROFS, 13 EACCES, 122 EDQUOT); later writes too
                             when FAULT_ERRNO_STICKY=1 (a disk that stays full)
  FAULT_COUNT=FILE           write the number of os.write calls to regular files to FILE
  FAULT_AT_LABEL=PREFIX      at the first write point (fixpack.apply.store.crashpoint) whose label
  FAULT_ACTION=ACTION:PATH   starts with PREFIX, do ACTION to PATH before going on:
                               dir      replace the file by a folder
                               symlink  replace the file by a symlink to FAULT_LINK_TO
                               swapdir  move the folder aside, a symlink to FAULT_LINK_TO in its place
                               edit     append a line to the file
                               rm       remove the file
                               chattr   make the file immutable (chattr +i)
"""

from __future__ import annotations

import os
import stat
import sys

_writes = 0
_real_write = os.write


def _faulty_write(fd, data):
    global _writes
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if regular:
        _writes += 1
        spec = os.environ.get("FAULT_ERRNO_AT")
        if spec:
            n, code = (int(x) for x in spec.split(":"))
            if _writes == n or (_writes > n and os.environ.get("FAULT_ERRNO_STICKY") == "1"):
                raise OSError(code, os.strerror(code))
    return _real_write(fd, data)


def _act(action: str, path: str) -> None:
    if action == "dir":
        os.unlink(path)
        os.mkdir(path)
    elif action == "symlink":
        os.unlink(path)
        os.symlink(os.environ["FAULT_LINK_TO"], path)
    elif action == "swapdir":  # a folder moved aside and a symlink to FAULT_LINK_TO put in its place
        os.rename(path, path + ".swapped-away")
        os.symlink(os.environ["FAULT_LINK_TO"], path)
    elif action == "edit":
        with open(path, "a") as f:
            f.write("# edited by someone else mid-run\n")
    elif action == "rm":
        os.unlink(path)
    elif action == "chattr":
        import subprocess

        subprocess.run(["chattr", "+i", path], check=True)
    else:
        raise SystemExit(f"faultwrap: unknown action {action}")


def install() -> None:
    os.write = _faulty_write
    import fixpack.apply.journal
    import fixpack.apply.store

    real_crashpoint = fixpack.apply.store.crashpoint
    prefix = os.environ.get("FAULT_AT_LABEL")
    done = []

    def crashpoint(label: str) -> None:
        if prefix and not done and label.startswith(prefix):
            done.append(label)
            action, path = os.environ["FAULT_ACTION"].split(":", 1)
            _act(action, path)
        real_crashpoint(label)

    fixpack.apply.store.crashpoint = crashpoint
    fixpack.apply.journal.crashpoint = crashpoint


def main() -> int:
    install()
    from fixpack.cli.main import main as fixpack_main

    try:
        return fixpack_main(sys.argv[1:])
    finally:
        out = os.environ.get("FAULT_COUNT")
        if out:
            with open(out, "w") as f:
                f.write(str(_writes))


if __name__ == "__main__":
    sys.exit(main())
