#!/usr/bin/env python3
"""Apply a profile and its named opt-in fixes; exit non-zero when the image does not match.

    python -I -S apply_all.py --profile v0.26.0 [opt-in fixes ...] [--port NAME] [--root DIR]

(``-I -S``: no ``.pth`` file, customize module, user site or PYTHON* variable runs code in it;
plain ``python apply_all.py`` works too, with the interpreter's site hooks run as usual.)

A thin door into `fixpack apply`; runs from a checkout without installing fixpack. At every
container start the selection is usually applied already: that case is answered by hashing
alone (fixpack.apply.fastpath), before the rest of fixpack is imported.
"""

import os
import sys

# os.path, not pathlib: pathlib alone costs more than the whole already-applied check.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
if sys.flags.no_site:
    # `python -I -S apply_all.py`: no .pth file of site-packages ran, and none will; its folders
    # go on the path as plain folders (what fixpack imports from them: yaml, libcst, unidiff).
    # Without `site`, a venv is not recognised either: its pyvenv.cfg is read here.
    import site

    prefixes = [sys.prefix]
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    for venv in (bindir, os.path.dirname(bindir)):
        cfg = os.path.join(venv, "pyvenv.cfg")
        if os.path.isfile(cfg):
            with open(cfg) as f:
                shared = any(line.replace(" ", "").lower().startswith("include-system-site-packages=true") for line in f)
            prefixes = [venv, sys.prefix] if shared else [venv]
            break
    sys.path += [d for d in site.getsitepackages(prefixes) if os.path.isdir(d) and d not in sys.path]


def _fast(argv):
    from fixpack.apply.fastpath import already_applied

    opts, names, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--profile", "--root", "--port", "--state-dir", "--pack") and i + 1 < len(argv):
            opts[a] = argv[i + 1]
            i += 2
        elif a.startswith("-"):
            return False  # anything unusual goes through the full engine
        else:
            names.append(a)
            i += 1
    if "--profile" not in opts:
        return False
    pack = os.path.abspath(opts.get("--pack", os.path.dirname(os.path.realpath(__file__))))
    root = os.path.abspath(opts["--root"]) if "--root" in opts else None
    state_dir = os.path.abspath(opts["--state-dir"]) if "--state-dir" in opts else None
    sel = already_applied(pack, opts["--profile"], names, opts.get("--port"), root, state_dir)
    if sel is None:
        return False
    kept = f"; port {sel['port']} kept from the image build" if sel.get("port") and "--port" not in opts else ""
    print(f"{opts['--profile']}: already applied ({len(sel['steps'])} fixes, all files at their pins{kept})")
    return True


if __name__ == "__main__":
    if _fast(sys.argv[1:]):
        sys.exit(0)
    from fixpack.cli.main import main

    # the pack is the checkout this file is in, for the full engine as for the fast path
    pack = [] if "--pack" in sys.argv[1:] else ["--pack", os.path.dirname(os.path.realpath(__file__))]
    sys.exit(main(["apply", *pack, *sys.argv[1:]]))
