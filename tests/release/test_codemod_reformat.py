"""The codemods survive what breaks a text edit: on the pinned release reformatted (ruff format,
its defaults, not the project's settings), each real codemod still finds each of its places
exactly once and gives the code the fix gives on the release as it is, reformatted the same
way (same ast.dump)."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from packtests.builders import REPO

pytestmark = pytest.mark.release

RUFF = Path(sys.executable).with_name("ruff")
CODEMODS = [
    "fixes/hybrid-no-prefill-merge",
    "fixes/seeded-sampling",
    "fixes/structured-output-rows",
    "ports/glm-5-3-flash/fixes/decode-layer-group",
]


@functools.lru_cache(maxsize=8)
def ruff_format(text: str) -> str:
    r = subprocess.run(
        [str(RUFF), "format", "--isolated", "--stdin-filename", "t.py", "-"], input=text, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from fixpack.errors import SourceUnavailable
    from fixpack.pack.pack import Pack
    from fixpack.sources import sources

    if not RUFF.exists():
        pytest.skip(f"ruff is not installed beside {sys.executable}")
    profile = Pack(REPO).profile("v0.26.0")
    try:
        return sources.materialise(profile.base["sources"], tmp_path_factory.mktemp("tree") / "tree")
    except SourceUnavailable as exc:
        pytest.skip(f"RELEASE SOURCES UNAVAILABLE, real-target tests skipped: {exc}")


@pytest.mark.parametrize("fix", CODEMODS, ids=lambda f: f.rsplit("/", 1)[-1])
def test_a_codemod_on_the_reformatted_release_finds_its_places_and_gives_the_fixed_code(release, fix):
    from fixpack.kinds.codemod import load, transform

    classes = load(REPO / fix)
    (rel,) = {c.TARGET for c in classes}
    src = (release / rel).read_text()
    fixed = transform(classes, rel, src, where=fix)
    assert fixed != src
    reformatted = ruff_format(src)
    assert reformatted != src  # the layout really changed
    # every place found exactly once (transform raises otherwise), and the same code
    fixed_there = transform(classes, rel, reformatted, where=fix)
    assert ast.dump(ast.parse(fixed_there)) == ast.dump(ast.parse(ruff_format(fixed)))
