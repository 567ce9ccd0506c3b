"""A profile whose release cannot be fetched here: pins made on its development base are said
as such, never applied to an image as if they were the release's, and replaced by real pins
once the release can be reached (a stand-in repository plays the unreachable release)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from packtests import builders as B

REPO = B.REPO


def _synthetic(tmp_path: Path):
    """The synthetic pack with git sources: a release commit nobody has, and a development base."""
    root = B.make_pack(tmp_path / "pack")
    src = B.pristine_source(root)
    dev = B.repo_of(src, tmp_path / "demo-clone", ["pkg_a", "pkg_b"])
    base = {"kind": "git", "repo": "demo", "commit": "0" * 40, "branch": "releases/next",
            "development": {"kind": "git", "repo": "demo", "commit": dev, "branch": "main", "why": "the release is not published where the tests run"}}
    import yaml

    prof = yaml.safe_load((root / "profiles" / "test.yaml").read_text())
    prof["base"] = {"sources": {"pkg_a": base, "pkg_b": base}}
    (root / "profiles" / "test.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    env = {"FIXPACK_CACHE": str(tmp_path / "cache"), "FIXPACK_OFFLINE": "1"}
    assert B.fixpack("sources", "add", "demo", str(tmp_path / "demo-clone"), env=env).returncode == 0
    return root, env


def test_development_pins_are_recorded_and_refused_on_an_image(tmp_path):
    root, env = _synthetic(tmp_path)
    for cmd in ("manifest", "lock"):
        r = B.fixpack(cmd, "--profile", "test", pack=root, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "using its development base" in r.stderr
    lock = json.loads((root / "profiles" / "test.lock.json").read_text())
    assert {p: b["base"] for p, b in lock["bases"].items()} == {"pkg_a": "development", "pkg_b": "development"}
    assert str(tmp_path) not in json.dumps(lock)  # the lock names no machine path
    listed = B.fixpack("list", "--profile", "test", pack=root, env=env).stdout
    assert "development base demo main" in listed and "pins it on its development base" in listed

    tree = tmp_path / "tree"
    assert B.fixpack("sources", "tree", str(tree), "--profile", "test", env=dict(env, FIXPACK_PACK=str(root))).returncode == 0
    before = B.tree_digest(tree)
    r = B.apply_all("--profile", "test", "--root", str(tree), "--pack", str(root), env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "pins it only on its development base" in out and "nothing was changed" in out
    assert "`fixpack lock --profile test`, then `fixpack check --profile test`" in out
    assert B.tree_digest(tree) == before and not (tree / ".fixpack" / "state.json").exists()

    ok = B.apply_all("--profile", "test", "--root", str(tree), "--pack", str(root), "--development-base", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert B.fixpack("verify", "--profile", "test", "--root", str(tree), pack=root, env=env).returncode == 0


def test_a_release_reachable_later_gets_real_pins_with_no_change_to_the_fixes(tmp_path):
    """The stand-in release: a commit other than the development base, reachable once added."""
    root, env = _synthetic(tmp_path)
    src = B.pristine_source(root)
    # the release differs from the development base in a file no fix touches
    release = B.repo_of(src, tmp_path / "release-clone", ["pkg_a", "pkg_b"], edit=lambda d: (d / "pkg_b" / "__init__.py").write_text("# released\n"))
    import yaml

    prof = yaml.safe_load((root / "profiles" / "test.yaml").read_text())
    for spec in prof["base"]["sources"].values():
        spec["commit"] = release  # stands in for the release commit that could not be fetched
    (root / "profiles" / "test.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    fixes_before = B.tree_digest(root / "fixes")
    assert B.fixpack("sources", "add", "demo", str(tmp_path / "release-clone"), env=env).returncode == 0
    for cmd in ("manifest", "lock"):
        r = B.fixpack(cmd, "--profile", "test", pack=root, env=env)
        assert r.returncode == 0 and "development base" not in r.stderr, r.stdout + r.stderr
    lock = json.loads((root / "profiles" / "test.lock.json").read_text())
    assert {p: (b["base"], b["spec"]["commit"]) for p, b in lock["bases"].items()} == {"pkg_a": ("release", release), "pkg_b": ("release", release)}
    assert B.tree_digest(root / "fixes") == fixes_before
    tree = tmp_path / "tree"
    assert B.fixpack("sources", "tree", str(tree), "--profile", "test", env=dict(env, FIXPACK_PACK=str(root))).returncode == 0
    assert (tree / "pkg_b" / "__init__.py").read_text() == "# released\n"
    r = B.apply_all("--profile", "test", "--root", str(tree), "--pack", str(root), env=env)
    assert r.returncode == 0, r.stdout + r.stderr  # real pins: no --development-base needed


@pytest.mark.release
def test_the_v030_profile_refuses_its_development_vllm_gaudi_on_an_image(tmp_path):
    tree = tmp_path / "site-packages"
    made = B.fixpack("sources", "tree", str(tree), "--profile", "v0.30.0")
    if made.returncode != 0:
        pytest.skip(f"v0.30.0 sources unavailable: {made.stderr.strip()[-300:]}")
    lock = json.loads((REPO / "profiles" / "v0.30.0.lock.json").read_text())
    if lock["bases"]["vllm_gaudi"]["base"] != "development":
        pytest.skip("this pack's v0.30.0 lock pins the vllm-gaudi release itself")
    assert lock["bases"]["vllm"] == {"base": "release", "spec": {"kind": "wheel", "distribution": "vllm", "version": "0.30.0", "commit": "ced6857af"}}
    before = B.tree_digest(tree)
    r = B.apply_all("--profile", "v0.30.0", "--root", str(tree))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "vllm_gaudi: profile v0.30.0 pins it only on its development base (vllm-gaudi main 091bbadda)" in r.stderr
    assert "releases/v0.30.0 058f107" in r.stderr and "`fixpack lock --profile v0.30.0`" in r.stderr
    assert B.tree_digest(tree) == before


@pytest.mark.release
def test_the_v030_profile_gets_release_pins_from_a_stand_in_clone(tmp_path):
    """A local repository standing in for releases/v0.30.0 (the development base plus one
    changed file no fix touches): with it, lock and apply give real release pins."""
    dev_tree = tmp_path / "dev"
    if B.fixpack("sources", "tree", str(dev_tree), "--profile", "v0.30.0").returncode != 0:
        pytest.skip("v0.30.0 sources unavailable")
    release = B.repo_of(dev_tree, tmp_path / "stand-in", ["vllm_gaudi"], edit=lambda d: (d / "vllm_gaudi" / "STAND_IN.txt").write_text("releases/v0.30.0 stand-in\n"))
    pack = tmp_path / "pack"
    shutil.copytree(REPO / "profiles", pack / "profiles")
    for name in ("fixpack", "fixes", "ports", "recipes"):
        if (REPO / name).exists():
            (pack / name).symlink_to(REPO / name, target_is_directory=True)
    prof = pack / "profiles" / "v0.30.0.yaml"
    text = prof.read_text()
    assert "      commit: 058f107\n" in text
    prof.write_text(text.replace("      commit: 058f107\n", f"      commit: {release}\n", 1))
    # a cache of its own (the real one keeps its mirror), sharing the downloaded vLLM wheel tree
    cache = tmp_path / "cache"
    (cache / "trees").mkdir(parents=True)
    from fixpack.sources import sources

    real = sources.cache_dir() / "trees" / "wheel-vllm-0.30.0"
    (cache / "trees" / "wheel-vllm-0.30.0").symlink_to(real, target_is_directory=True)
    env = {"FIXPACK_CACHE": str(cache), "FIXPACK_OFFLINE": "1"}
    assert B.fixpack("sources", "add", "vllm-gaudi", str(tmp_path / "stand-in"), env=env).returncode == 0
    for cmd in ("manifest", "lock"):
        r = B.fixpack(cmd, "--profile", "v0.30.0", pack=pack, env=env)
        assert r.returncode == 0 and "development base" not in r.stderr, r.stdout + r.stderr
    lock = json.loads((pack / "profiles" / "v0.30.0.lock.json").read_text())
    assert lock["bases"]["vllm_gaudi"]["base"] == "release" and lock["bases"]["vllm_gaudi"]["spec"]["commit"] == release
    tree = tmp_path / "image"
    assert B.fixpack("sources", "tree", str(tree), "--profile", "v0.30.0", env=dict(env, FIXPACK_PACK=str(pack))).returncode == 0
    r = B.apply_all("--profile", "v0.30.0", "--root", str(tree), "--pack", str(pack), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert B.fixpack("verify", "--profile", "v0.30.0", "--root", str(tree), pack=pack, env=env).returncode == 0
