#!/usr/bin/env python3
"""Apply a profile and its named opt-in fixes; exit non-zero when the image does not match.

    python apply_all.py --profile v0.26.0 [opt-in fixes ...] [--port NAME] [--root DIR]

A thin door into `fixpack apply`; runs from a checkout without installing fixpack. At every
container start the selection is usually applied already: that case is answered by hashing
alone (fixpack.fastpath), before the rest of fixpack is imported.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _fast(argv):
    import os

    from fixpack.fastpath import already_applied

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
    if "--profile" not in opts or any(n in sys.modules for n in ("vllm", "vllm_gaudi")):
        return False
    pack = os.path.abspath(opts.get("--pack", os.path.dirname(os.path.abspath(__file__))))
    names_of_packages = ("vllm", "vllm_gaudi")
    if "--root" in opts:
        root = os.path.abspath(opts["--root"])
        packages = {n: os.path.join(root, n) for n in names_of_packages}
        default_state = os.path.join(root, ".fixpack")
    else:
        import importlib.util

        packages = {}
        for n in names_of_packages:
            spec = importlib.util.find_spec(n)  # top-level: locates, does not import
            if spec is None or not spec.submodule_search_locations:
                return False
            packages[n] = list(spec.submodule_search_locations)[0]
        default_state = os.path.join(sorted(os.path.dirname(p) for p in packages.values())[0], ".fixpack")
    state_dir = os.path.abspath(opts.get("--state-dir", default_state))
    sel = already_applied(pack, opts["--profile"], names, opts.get("--port"), state_dir, packages)
    if sel is None:
        return False
    print(f"{opts['--profile']}: already applied ({len(sel['steps'])} fixes, all files at their pins)")
    return True


if __name__ == "__main__":
    if _fast(sys.argv[1:]):
        sys.exit(0)
    from fixpack.main import main

    sys.exit(main(["apply", *sys.argv[1:]]))
