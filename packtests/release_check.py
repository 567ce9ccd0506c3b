"""The release tests' helpers: the v0.26.0 release tree from the fixpack cache (the test skipped,
said loudly, where the cache lacks it), and what they require of `fixpack check --json`."""

from __future__ import annotations

import pytest

from packtests.builders import REPO


def release_tree(tmp_path):
    """(the v0.26.0 release sources materialised under ``tmp_path``, the profile)."""
    from fixpack.errors import SourceUnavailable
    from fixpack.pack.pack import Pack
    from fixpack.sources import sources

    profile = Pack(REPO).profile("v0.26.0")
    try:
        return sources.materialise(profile.base["sources"], tmp_path / "tree"), profile
    except SourceUnavailable as exc:
        pytest.skip(f"RELEASE SOURCES UNAVAILABLE, real-target tests skipped: {exc}")


def proof_holds(data):
    """Every fix checked under the per-test rules: each test red then green (or a declared
    guard), every part needed (or declared untested), its requires verified."""
    print("\n".join(f"{x['fix']:<34} {x['result']:<9} {x.get('detail', '')[:160]}" for x in data["results"]))
    print("totals:", data.get("totals"), "seconds:", data.get("phase_seconds"))
    failed = [x for x in data["results"] if x["result"] == "FAILED"]
    assert not failed, [(x["fix"], x["detail"][:1500]) for x in failed]
    for x in data["results"]:
        if "tests" not in x:
            continue
        assert x["tests"] and all(t["ok"] for t in x["tests"]), x["fix"]
        assert x["red_green"] >= 1, f"{x['fix']}: no test is red before it"
        assert x["requires"]["result"] == "verified", x["fix"]
        assert all(p["result"] in ("needed", "comment-only", "untested (declared)") for p in x["parts"]), x["fix"]
        assert len(x["parts"]) == x["n_parts"] or x["n_parts"] == 1, x["fix"]
