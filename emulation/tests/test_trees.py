"""hpu_harness.trees: a release source that cannot be had is a skip (SOURCE UNAVAILABLE, fixpack's
exit 8); any other failure to build or patch a tree is a failure (TreeBuildFailed), never a skip.
The runner tests catch only the first (a tree that does not build used to turn them into skips)."""

from __future__ import annotations

import ast
import stat
from pathlib import Path

import pytest

from hpu_harness import trees

REPO = Path(__file__).resolve().parents[2]


def fake_python(tmp_path, rc: int) -> Path:
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\necho 'fake fixpack' >&2\nexit {rc}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@pytest.mark.parametrize(
    ("rc", "error"), [(8, trees.SourcesUnavailable), (3, trees.TreeBuildFailed), (4, trees.TreeBuildFailed)]
)
def test_only_an_unavailable_source_is_told_apart(tmp_path, monkeypatch, rc, error):
    monkeypatch.setattr(trees, "fixpack_python", lambda: fake_python(tmp_path, rc))
    with pytest.raises(error) as got:
        trees.build(tmp_path / "tree", "v0.26.0")
    assert type(got.value) is error
    if error is trees.SourcesUnavailable:
        assert str(got.value).startswith("SOURCE UNAVAILABLE")


def _handlers_around_tree_builds(path: Path) -> list[str]:
    """The exception names caught by a try whose body builds a release tree."""
    caught = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Try):
            continue
        calls = {
            getattr(n.func, "attr", getattr(n.func, "id", ""))
            for stmt in node.body
            for n in ast.walk(stmt)
            if isinstance(n, ast.Call)
        }
        if calls & {"build", "release_tree", "development_tree", "use_companion_vllm"}:
            for h in node.handlers:
                caught.append(ast.unparse(h.type) if h.type is not None else "(bare)")
    return caught


def test_no_test_turns_a_failed_tree_build_into_a_skip():
    files = [*REPO.glob("emulation/tests/*.py"), *REPO.glob("packtests/*.py"), *REPO.glob("ports/*/tests/**/*.py")]
    wrong = {}
    for f in files:
        bad = [
            h for h in _handlers_around_tree_builds(f) if h not in ("trees.SourcesUnavailable", "SourcesUnavailable")
        ]
        if bad:
            wrong[str(f.relative_to(REPO))] = bad
    assert not wrong, f"a try around a tree build catches more than SourcesUnavailable: {wrong}"
