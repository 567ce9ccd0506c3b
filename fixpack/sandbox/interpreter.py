"""How fixpack starts a Python: with nothing on its path that another user could write.

fixpack runs as root, and the package folders may belong to someone else. A ``.pth`` file in
site-packages, a ``sitecustomize``, the user site, ``PYTHONPATH``, ``PYTHONSTARTUP`` or a module
dropped in a folder on ``sys.path`` all run code in an interpreter before (or instead of) the
code it was started for. So every interpreter fixpack starts (the fork servers, whose children
are the fixes' processes) is started with ``-I`` (no environment variables, no user site, no
script folder on the path) and ``-S`` (no ``site``: no ``.pth`` file is read, no customize
module imported), in ``/`` (a folder only root can write), with its path given explicitly on
its command line: fixpack's own folder, then the folders the driver imports from. Each of them,
and each folder above it, must be one no other user can write (`untrusted`); one that is is
refused by name before anything starts (exit 6).

The driver itself is started by whoever runs it: ``python -I -S apply_all.py`` gives it the same
isolation (apply_all.py then puts the interpreter's site-packages on its path itself, without
reading their ``.pth`` files); its own path is checked by the same rule before it starts a server.
"""

from __future__ import annotations

import json
import os
import stat
import sys

from fixpack.errors import EnvironmentFault

# The fork servers' working folder: only root can write it, so nothing there can be picked up
# by a relative name (and the servers never chdir anywhere a fix's process could have written).
SAFE_CWD = "/"

# What the started interpreter runs: its path, from its first argument, then the module's main.
_BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv.pop(1)); import {module} as m; sys.exit(m.main(sys.argv[1:]))"
)

_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def server_path() -> list[str]:
    """The path a started interpreter gets: fixpack's own folder first (the one this driver runs
    from: an editable install's finder is a ``.pth`` hook, which ``-S`` does not run), then every
    folder on the driver's path that exists, but its working folder (the driver's caller's,
    which ``python -m`` puts first)."""
    cwd = os.getcwd()
    out = [_PKG_PARENT]
    for entry in sys.path:
        if not entry or entry == cwd or entry in out:
            continue
        if os.path.exists(entry):
            out.append(entry)
    return out


def command(module: str, path: list[str], args: list[str]) -> list[str]:
    """The argument list that starts ``module``'s ``main(args)`` in an isolated interpreter."""
    return [sys.executable, "-I", "-S", "-B", "-c", _BOOT.format(module=module), json.dumps(path), *args]


def untrusted(entry: str) -> str | None:
    """Why another user could put code at ``entry`` (a folder or zip on ``sys.path``), or None.

    The entry (or, where it does not exist, the nearest folder above it, where it could be made)
    must be owned by root or by this user and writable by neither its group (unless that is
    root's group) nor others; every folder above it must be owned by root or this user and,
    where its group (not root's) or others may write it, have the sticky bit (so that no one
    else can rename or replace what is in it)."""
    me = os.geteuid()
    path = os.path.realpath(entry)
    first = True
    while True:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                return None
            path = parent
            continue  # where it is missing, whoever can write the folder above can make it
        except OSError as exc:
            return f"{path} cannot be checked ({exc.strerror})"
        if st.st_uid not in (0, me):
            return f"{path} is owned by uid {st.st_uid}"
        group_writes = bool(st.st_mode & stat.S_IWGRP) and st.st_gid != 0
        others_write = bool(st.st_mode & stat.S_IWOTH)
        if first and (group_writes or others_write):
            return f"{path} is writable by {'others' if others_write else f'group {st.st_gid}'} (mode {oct(stat.S_IMODE(st.st_mode))})"
        if not first and (group_writes or others_write) and not st.st_mode & stat.S_ISVTX:
            return f"{path} is writable by {'others' if others_write else f'group {st.st_gid}'} without the sticky bit (mode {oct(stat.S_IMODE(st.st_mode))})"
        first = False
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def refuse_untrusted(entries: list[str], whose: str) -> None:
    """Refuse (exit 6) the first of ``entries`` another user could write, naming it."""
    for entry in entries:
        if not entry:
            continue
        why = untrusted(entry)
        if why:
            raise EnvironmentFault(
                f"{entry}: on {whose} path, and another user can write there ({why}): code they put there would run as "
                f"uid {os.geteuid()}; nothing was started. Take it off the path (PYTHONPATH, a .pth file), or make it "
                "writable by root only"
            )
