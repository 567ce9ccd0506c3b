"""Profile v0.30.0 against its sources: the vLLM half on the exact 0.30.0 wheel, the vllm-gaudi
half on its development base (vllm-gaudi main beside vLLM 0.27.0) wherever releases/v0.30.0
cannot be fetched; every fix checked under the per-test rules, each labelled with its base."""

from __future__ import annotations

import json

import pytest

from packtests.builders import REPO, fixpack
from packtests.release_check import proof_holds

pytestmark = pytest.mark.release


def _lock():
    return json.loads((REPO / "profiles" / "v0.30.0.lock.json").read_text())


def test_v030_lock_and_manifest_are_what_the_sources_give():
    for cmd in ("manifest", "lock"):
        r = fixpack(cmd, "--profile", "v0.30.0", "--check", timeout=1800)
        if r.returncode == 8:
            pytest.skip(f"v0.30.0 sources unavailable: {r.stderr[-300:]}")
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]


def test_every_v030_fix_is_proven_on_its_base():
    r = fixpack("check", "--profile", "v0.30.0", "--json", timeout=4800)
    assert r.returncode in (0, 9), r.stderr[-3000:]
    data = json.loads(r.stdout)
    if data["skipped_sources"]:
        pytest.skip("v0.30.0 fixes not checked: sources unavailable: " + ", ".join(data["skipped_sources"]))
    proof_holds(data)
    bases = _lock()["bases"]
    checked = [x for x in data["results"] if "tests" in x]
    assert checked, "no v0.30.0 fix was checked"
    for x in checked:
        fix_packages = {t.split("/", 1)[0] for t in _lock_targets(x["fix"])}
        for package in fix_packages:
            label = x["base"] or ""
            assert f"{package}: {bases[package]['base']} base" in label, (x["fix"], label)
            if bases[package]["base"] == "development" and package == "vllm_gaudi":
                assert "beside vllm 0.27.0" in label, (x["fix"], label)
            if package == "vllm":
                assert "0.30.0" in label, (x["fix"], label)


def _lock_targets(fix_id: str) -> list[str]:
    for sel in _lock()["selections"]:
        for step in sel["steps"]:
            if step["fix"] == fix_id:
                return list(step["files"])
    return []


def test_every_glm_5_mxfp4_port_patch_is_proven_on_the_development_base():
    r = fixpack("check", "--profile", "v0.30.0", "--port", "glm-5-mxfp4", "--json", timeout=2400)
    assert r.returncode in (0, 9), r.stderr[-3000:]
    data = json.loads(r.stdout)
    if data["skipped_sources"]:
        pytest.skip("glm-5-mxfp4 patches not checked: sources unavailable: " + ", ".join(data["skipped_sources"]))
    proof_holds(data)
    from fixpack.pack.pack import Pack

    port = Pack(REPO).port("glm-5-mxfp4")
    proven = {x["fix"] for x in data["results"] if x["result"] == "proven"}
    assert proven == set(port.patches)
    for x in data["results"]:
        if "tests" in x:  # a fix's row; the re-run and revert rows carry no base
            assert "vllm_gaudi: development base" in (x["base"] or ""), (x["fix"], x["base"])
