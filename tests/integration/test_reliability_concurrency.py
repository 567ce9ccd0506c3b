"""Concurrency: runs started at once on one tree. Exactly one applies, the others wait on the
lock and report the selection applied; the final state is exact; every run ends within a bound
(no deadlock). A run SIGKILLed while it holds the lock releases it (flock dies with the
process) and the next run finishes its interrupted fix from the journal."""

from __future__ import annotations

import pytest

from packtests import reliability_lib as L

SCENARIOS = dict(L.concurrency_scenarios())


@pytest.mark.parametrize("name", ["8 x fixpack apply at once", "8 runs, the lock holder killed mid-commit"])
def test_concurrent(name, tmp_path):
    SCENARIOS[name](tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["8 x apply_all.py at once", "4 apply + 4 revert --all at once"])
def test_concurrent_more(name, tmp_path):
    SCENARIOS[name](tmp_path)
