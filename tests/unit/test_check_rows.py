"""fixpack check's re-run and revert rows (fixpack/proofs/check.py ``_rerun_and_revert``), with a
stand-in engine: what each outcome of the second apply is reported as."""

from __future__ import annotations

import pytest

from fixpack.proofs import check


class _Engine:
    def __init__(self, fixes: int, done: bool):
        self.fixes = [object()] * fixes
        self._done = done

    def fast_path_done(self) -> bool:
        return self._done


@pytest.fixture(autouse=True)
def _no_revert(monkeypatch):
    import fixpack.apply.engine as engine

    monkeypatch.setattr(engine, "revert", lambda engine, fix: None)


@pytest.mark.parametrize(
    ("fixes", "done", "result", "detail"),
    [
        (0, True, "ok", "second apply is a no-op"),
        (0, False, "FAILED", "a second apply is not a no-op: the fast path does not find the chain applied"),
        (2, False, "ok", "n/a (partial chain)"),  # fewer steps than fixes: the fast path is not asked
    ],
)
def test_the_rerun_row_says_what_the_second_apply_found(tmp_path, fixes, done, result, detail):
    rerun, revert = check._rerun_and_revert(_Engine(fixes, done), [], tmp_path, {})
    assert (rerun["fix"], rerun["result"], rerun["detail"]) == ("(re-run)", result, detail)
    assert (revert["result"], revert["detail"]) == ("ok", "pristine bytes restored")
