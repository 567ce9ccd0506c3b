"""Runs the killed conversions of the crash test: `python crash_runner.py SRC BASE N`.

Imports the converter once, then for each write point n = 1..N forks a child that runs
`convert --workers 1` into BASE/k<n> with GLM5_MXFP4_CRASH_AT=n, so the child SIGKILLs itself at
its n-th write point. The parent never runs a kernel before forking (numba starts its threads on
the first call), so every child is a clean single-threaded copy. Prints each child's wait status.
"""

from __future__ import annotations

import json
import os
import sys

# the port folder is on PYTHONPATH (the crash test sets it)
from glm5_mxfp4 import convert, output


def main(src: str, base: str, count: int) -> list[dict]:
    results = []
    for n in range(1, count + 1):
        pid = os.fork()
        if pid == 0:  # the child: convert until the n-th write point kills it
            os.environ["GLM5_MXFP4_CRASH_AT"] = str(n)
            output._crash_counter = 0
            rc = convert.main([src, os.path.join(base, f"k{n}"), "--workers", "1", "--quiet"])
            os._exit(100 + rc)  # reached only if the kill did not happen
        _, status = os.waitpid(pid, 0)
        results.append(
            {
                "n": n,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            }
        )
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
