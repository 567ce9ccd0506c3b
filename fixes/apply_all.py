#!/usr/bin/env python3
"""The door the serving pages' launch lines use: ``python3 "$COOKBOOK/fixes/apply_all.py" --profile ...``.

It runs the cookbook's own apply_all.py (one folder up) exactly as if that had been called:
same arguments, same exit code, same already-applied fast path.
"""

import os
import runpy

if __name__ == "__main__":
    # abspath, not realpath: the cookbook is the folder above this one as the caller named it
    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "apply_all.py"), run_name="__main__")
