"""Resource faults: full disk, read-only tree, permission denied, targets swapped for a folder
or a symlink mid-run, the state record, journal or backups lost or corrupted, the lock held.
Each ends with a clear error and the exit code of its class (6 environment, 5 drift, 7 locked)
with no target changed, or with an exact recovery.

How the faults are made (we run as root, which ignores file modes):
- full disk: a real 1 MiB tmpfs filled up (mount), and ENOSPC injected at the N-th file write
  (packtests/faultwrap.py patches os.write in the fixpack process);
- read-only: a read-only bind mount of the tree, and EROFS injected;
- permission denied: `chattr +i` on one target, and EACCES injected;
- swaps mid-run: packtests/faultwrap.py acts at a named write point of the run.
Scenarios that need mount or chattr skip where those are not permitted.
"""

from __future__ import annotations

import errno

import pytest

from packtests import reliability_lib as L

SCENARIOS = dict(L.fault_scenarios())
# The default run: one of each class; `-m slow` runs the rest (bench/reliability_report.py runs all).
CI = {
    "full disk: tmpfs, 2 free pages",
    "read-only tree, state elsewhere",
    "permission denied on one target (chattr +i)",
    "target replaced by a symlink mid-run",
    "target is a symlink out of the package",
    "state record deleted",
    "state record wrong shape",
    "journal wrong shape",
    "backups deleted",
    "lock held by another process",
    "symlink planted at the temporary name",
    "setuid/setgid mode and owner kept",
}


def _run(fn, tmp_path):
    try:
        fn(tmp_path)
    except L.Skip as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n in CI])
def test_fault(name, tmp_path):
    _run(SCENARIOS[name], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n not in CI])
def test_fault_more(name, tmp_path):
    _run(SCENARIOS[name], tmp_path)


@pytest.mark.parametrize("n", [2, 4, 5])
def test_enospc_at_a_sample_of_writes(n, tmp_path):
    """Write 2: the second backup; 4: fix-one's target; 5: the state record after the rename
    (the roll back has no room either: the journal stays and the next run finishes the fix)."""
    L.fault_errno_at(tmp_path, n, errno.ENOSPC)


@pytest.mark.slow
def test_enospc_at_every_write(tmp_path):
    total = L.count_writes(tmp_path)
    assert total >= 8
    for n in range(1, total + 1):
        L.fault_errno_at(tmp_path / f"n{n}", n, errno.ENOSPC)
