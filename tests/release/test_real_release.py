"""The engine on the real v0.26.0 release files (vLLM from its PyPI wheel, checked against
RECORD; vllm-gaudi from git at the pinned commit), and the release check of every fix."""

from __future__ import annotations

import json

import pytest

from packtests.builders import REPO, apply_all, fixpack
from packtests.release_check import proof_holds, release_tree

pytestmark = pytest.mark.release


def manifest():
    return json.loads((REPO / "profiles" / "v0.26.0.manifest.json").read_text())["files"]


def tree_matches_manifest(tree, rels):
    from fixpack.apply.hashing import sha256_file

    m = manifest()
    return {rel: sha256_file(tree / rel) == m[rel.split("/", 1)[0]][rel.split("/", 1)[1]] for rel in rels}


def test_profile_applies_reruns_verifies_detects_tampering_and_reverts_byte_for_byte(tmp_path):
    tree, profile = release_tree(tmp_path)
    lock = json.loads(profile.lock_path.read_text())
    rels = sorted(lock["pristine"])
    assert rels, "the lock pins no file"
    assert all(tree_matches_manifest(tree, rels).values())

    r = apply_all("--profile", "v0.26.0", "--root", str(tree))
    assert r.returncode == 0, r.stdout + r.stderr
    default = next(s for s in lock["selections"] if s["key"] == "-|")
    assert r.stdout.count("applied") >= len(default["steps"])
    changed = {rel for s in default["steps"] for rel in s["files"]}
    status = tree_matches_manifest(tree, rels)
    assert not any(status[rel] for rel in changed)  # every touched file left its pristine bytes

    r = apply_all("--profile", "v0.26.0", "--root", str(tree))
    assert r.returncode == 0 and "already applied" in r.stdout

    r = fixpack("verify", "--profile", "v0.26.0", "--root", str(tree), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert {f["status"] for f in data["fixes"]} == {"applied"}

    victim = tree / sorted(changed)[0]
    original = victim.read_bytes()
    victim.write_bytes(original + b"\n# tampered\n")
    r = fixpack("verify", "--profile", "v0.26.0", "--root", str(tree))
    assert r.returncode == 5 and "drifted" in r.stdout
    r = apply_all("--profile", "v0.26.0", "--root", str(tree))
    assert r.returncode == 5 and "someone edited it" in r.stderr
    victim.write_bytes(original)

    r = fixpack("revert", "--all", "--profile", "v0.26.0", "--root", str(tree))
    assert r.returncode == 0, r.stderr
    assert all(tree_matches_manifest(tree, rels).values())


def test_lock_is_what_the_release_sources_give():
    r = fixpack("lock", "--profile", "v0.26.0", "--check", timeout=1800)
    if r.returncode == 8:
        pytest.skip(f"RELEASE SOURCES UNAVAILABLE: {r.stderr.strip()}")
    assert r.returncode == 0, r.stdout + r.stderr


def test_manifest_is_what_the_release_sources_give():
    r = fixpack("manifest", "--profile", "v0.26.0", "--check", timeout=600)
    if r.returncode == 8:
        pytest.skip(f"RELEASE SOURCES UNAVAILABLE: {r.stderr.strip()}")
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_fix_is_proven_red_green_against_the_release():
    r = fixpack("check", "--profile", "v0.26.0", "--json", timeout=4800)
    assert r.returncode in (0, 9), r.stderr[-3000:]
    data = json.loads(r.stdout)
    if data["skipped_sources"]:
        print("!!! RELEASE CHECK SKIPPED for: " + "; ".join(f"{k}: {v}" for k, v in data["skipped_sources"].items()))
    proof_holds(data)
    proven = [x for x in data["results"] if x["result"] == "proven"]
    assert proven or data["skipped_sources"], "no fix was proven"
    if data["skipped_sources"]:
        pytest.skip("some fixes not checked: their release sources are unavailable: " + ", ".join(data["skipped_sources"]))


def test_rebase_report_classifies_every_fix_on_a_later_release():
    """vllm-gaudi main after v0.26.0 and the vLLM 0.27.0 wheel: every fix gets one class (the
    text-only report; the tests run on it below for the fixes upstream answered)."""
    r = fixpack("rebase-report", "--profile", "v0.26.0", "--onto", "vllm_gaudi=main", "--onto", "vllm=0.27.0", "--no-tests", "--json", timeout=1800)
    if r.returncode == 8:
        pytest.skip(f"LATER RELEASE SOURCES UNAVAILABLE: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    from fixpack.pack.pack import Pack

    profile = Pack(REPO).profile("v0.26.0")
    assert [x["fix"] for x in data["fixes"]] == [e.id for e in profile.entries]
    classes = {"exact", "offset", "conflict", "upstream", "duplicate", "moved", "nomatch"}
    assert all(x["class"] in classes for x in data["fixes"])
    # async-discard-counter's code was rewritten upstream after v0.26.0 (getattr): it must not apply as is
    by_id = {x["fix"]: x for x in data["fixes"]}
    assert by_id["async-discard-counter"]["class"] == "conflict"
    # main has upstream's own copy of the guard (c8d89091). As a text replacement the fix would have
    # added it twice ("duplicate"); as a codemod it finds the guard already there and changes
    # nothing: already upstream, never applied twice
    merge = by_id["hybrid-no-prefill-merge"]
    assert merge["class"] == "upstream", merge
    assert any("changes nothing" in n for n in merge["notes"]), merge
    for x in data["fixes"]:
        if x["class"] == "offset":
            assert x["refreshed_diff"].startswith("--- a/")


def test_every_port_patch_is_proven_red_green_against_the_release():
    r = fixpack("check", "--profile", "v0.26.0", "--port", "glm-5-3-flash", "--json", timeout=2400)
    assert r.returncode in (0, 9), r.stderr[-3000:]
    data = json.loads(r.stdout)
    if data["skipped_sources"]:
        pytest.skip("port patches not checked: release sources unavailable: " + ", ".join(data["skipped_sources"]))
    proof_holds(data)
    from fixpack.pack.pack import Pack

    port = Pack(REPO).port("glm-5-3-flash")
    proven = {x["fix"] for x in data["results"] if x["result"] in ("proven", "NOT-CPU")}
    assert proven == set(port.patches)


@pytest.mark.parametrize("port", [None, "glm-5-3-flash"])
def test_every_pinned_fix_gives_its_pinned_bytes_and_only_codemods_import_libcst(tmp_path, monkeypatch, port):
    """The worker runs each fix of the selection, in order, on the real release: each output
    must be its pin. A diff or an edit runs with libcst not even importable here; a codemod
    is the only kind that imports it."""
    import os
    import sys

    from fixpack.apply.hashing import sha256_bytes
    from fixpack.pack.pack import Pack
    from fixpack.sandbox import worker

    tree, profile = release_tree(tmp_path)
    pack = Pack(REPO)
    port_obj = pack.port(port) if port else None
    lock = json.loads(profile.lock_path.read_text())
    steps = next(s for s in lock["selections"] if s["key"] == f"{port or '-'}|")["steps"]
    kinds = set()
    for i, step in enumerate(steps):
        fix = pack.fix(step["fix"], port=port_obj if lock["fixes"][step["fix"]]["layer"].startswith("port:") else None)
        kinds.add(fix.kind)
        with monkeypatch.context() as mp:
            if fix.kind != "codemod":
                for name in [m for m in sys.modules if m == "libcst" or m.startswith(("libcst.", "fixpack.kinds.codemod"))]:
                    mp.delitem(sys.modules, name)
                mp.setitem(sys.modules, "libcst", None)
            stage = tmp_path / f"stage{i}"
            stage.mkdir()
            job = {
                "fix_dir": str(fix.dir), "kind": fix.kind, "stage_dir": str(stage),
                "expect": {rel: after for rel, (_, after) in step["files"].items()},
                "targets": [{"rel": rel, "src": str(tree / rel), "out": str(stage / f"{j}.out")} for j, rel in enumerate(step["files"])],
            }
            worker.run(job)
        for t in job["targets"]:
            out = (stage / t["out"].rsplit("/", 1)[1]).read_bytes()
            assert sha256_bytes(out) == job["expect"][t["rel"]], f"{fix.id}: {t['rel']}"
            os.replace(stage / t["out"].rsplit("/", 1)[1], tree / t["rel"])  # never write through the cache's hard links
    assert kinds == {"diff", "edit", "codemod"}
