"""The serving page's launch line, run as the page writes it, in an image the port was installed in.

The image is a scratch tree of the real v0.26.0 release prepared by the port's
``install.sh --root`` (the port's patches and the profile's defaults). The packages are found
the way an image finds them (on the Python path, no ``--root``), and the line does not name the
port: the engine keeps the port the state record shows applied at image build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testing.builders import REPO

SEEDS = REPO.parent / "shared" / "seeds"
PORT = "glm-5-3-flash"

# Copied from the GLM-5.3-Flash serving page's launch block, character for character.
SEED_LINE = 'python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.26.0 glm47-streaming-text-markers || exit 1'

pytestmark = pytest.mark.release


def _fixpack(*args, env=None):
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "fixpack", *args], capture_output=True, text=True, env=e)


def test_the_copied_line_is_the_seeds_line():
    pages = sorted(SEEDS.glob("000_*.txt")) if SEEDS.is_dir() else []
    if not pages:
        pytest.skip("the seeds folder is not beside this checkout")
    assert SEED_LINE in pages[0].read_text().splitlines()


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("image") / "site-packages"
    made = _fixpack("sources", "tree", str(tree), "--profile", "v0.26.0")
    if made.returncode != 0:
        pytest.skip(f"release sources unavailable: {made.stderr.strip()[-300:]}")
    env = dict(os.environ, COOKBOOK=str(REPO), PYTHON=sys.executable, GLM5_NEXT_MHC_SINKHORN="torch")
    env.pop("PYTHONPATH", None)
    inst = subprocess.run(["bash", str(REPO / "ports" / PORT / "install.sh"), "--root", str(tree), "--no-plugin"], capture_output=True, text=True, env=env, timeout=900)
    assert inst.returncode == 0, (inst.stdout + inst.stderr)[-4000:]
    return tree


def _launch(tree: Path) -> subprocess.CompletedProcess:
    """The line verbatim in bash, with the image's python3 first on PATH and its packages on the path."""
    env = dict(os.environ, COOKBOOK=str(REPO), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(tree))
    return subprocess.run(["bash", "-c", SEED_LINE], capture_output=True, text=True, env=env, timeout=600)


def _verify(tree: Path) -> dict:
    v = _fixpack("verify", "--profile", "v0.26.0", "--root", str(tree), "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    return json.loads(v.stdout)


def test_the_seeds_launch_line_runs_verbatim_and_keeps_the_port(image):
    first = _launch(image)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert f"keeping port {PORT}" in out
    assert "glm47-streaming-text-markers" in out and "applied" in out
    state = _verify(image)
    assert state["applied"]["port"] == PORT and state["applied"]["opt_in"] == ["glm47-streaming-text-markers"]
    fixes = [f["fix"] for f in state["fixes"]]
    assert fixes[:4] == ["nope-mla-kpe-view", "synced-loader-return", "kda-cache-group", "decode-layer-group"]
    assert fixes[-1] == "glm47-streaming-text-markers"
    assert state["drift"] is False and all(f["status"] == "applied" for f in state["fixes"])

    again = _launch(image)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "already applied" in again.stdout and f"port {PORT} kept" in again.stdout
    assert _verify(image)["fixes"] == state["fixes"]


def test_the_door_passes_on_a_refusal(image, tmp_path):
    """The door's exit code is the engine's: a tree that is not the release stops the launch."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "vllm").mkdir()
    (bad / "vllm_gaudi").mkdir()
    env = dict(os.environ, COOKBOOK=str(REPO), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(bad))
    r = subprocess.run(["bash", "-c", SEED_LINE + "; echo launched"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "launched" not in r.stdout  # `|| exit 1` stops the container start
    assert "base mismatch" in r.stderr or "not found" in r.stderr, r.stderr[-2000:]


# Copied from the GLM-5.3 MXFP4 page's launch block (two lines joined by its backslash).
SEED_LINE_030 = 'python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.30.0 \\\n    vllm-long-prefill-share glm47-streaming-text-markers || exit 1'


def test_the_copied_v030_line_is_the_seeds_line():
    pages = sorted(SEEDS.glob("003_*.txt")) if SEEDS.is_dir() else []
    if not pages:
        pytest.skip("the seeds folder is not beside this checkout")
    assert SEED_LINE_030 in pages[0].read_text()


def _launch_030(tree: Path, cookbook: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, COOKBOOK=str(cookbook), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(tree), **(extra_env or {}))
    return subprocess.run(["bash", "-c", SEED_LINE_030 + "\necho launched"], capture_output=True, text=True, env=env, timeout=600)


def test_the_v030_line_stops_the_launch_while_vllm_gaudi_has_development_pins_only(tmp_path):
    lock = json.loads((REPO / "profiles" / "v0.30.0.lock.json").read_text())
    if lock["bases"]["vllm_gaudi"]["base"] != "development":
        pytest.skip("this pack's v0.30.0 lock pins the vllm-gaudi release itself")
    tree = tmp_path / "site-packages"
    if _fixpack("sources", "tree", str(tree), "--profile", "v0.30.0").returncode != 0:
        pytest.skip("v0.30.0 sources unavailable")
    before = {p: p.stat().st_ino for p in tree.rglob("*.py")}
    r = _launch_030(tree, REPO)
    assert r.returncode == 1 and "launched" not in r.stdout, r.stdout + r.stderr
    assert "pins it only on its development base" in r.stderr and "`fixpack lock --profile v0.30.0`" in r.stderr
    assert {p: p.stat().st_ino for p in tree.rglob("*.py")} == before  # nothing replaced


def test_the_v030_line_runs_verbatim_once_the_release_is_pinned(tmp_path):
    """A stand-in for releases/v0.30.0 (the development base plus a file no fix touches), pinned
    with `fixpack manifest` and `fixpack lock`: the seed's line applies, re-runs, and verify agrees."""
    import shutil

    from testing.builders import repo_of as _repo_of

    dev = tmp_path / "dev"
    if _fixpack("sources", "tree", str(dev), "--profile", "v0.30.0").returncode != 0:
        pytest.skip("v0.30.0 sources unavailable")
    release = _repo_of(dev, tmp_path / "stand-in", ["vllm_gaudi"], edit=lambda d: (d / "vllm_gaudi" / "STAND_IN.txt").write_text("stand-in\n"))
    pack = tmp_path / "cookbook"
    shutil.copytree(REPO / "profiles", pack / "profiles")
    shutil.copy2(REPO / "apply_all.py", pack / "apply_all.py")  # apply_all finds its pack by realpath
    for name in ("fixpack", "fixes", "fixes-v0.30.0", "ports", "recipes"):
        (pack / name).symlink_to(REPO / name, target_is_directory=True)
    prof = pack / "profiles" / "v0.30.0.yaml"
    prof.write_text(prof.read_text().replace("      commit: 058f107\n", f"      commit: {release}\n", 1))
    from fixpack import sources

    cache = tmp_path / "cache"
    (cache / "trees").mkdir(parents=True)
    (cache / "trees" / "wheel-vllm-0.30.0").symlink_to(sources.cache_dir() / "trees" / "wheel-vllm-0.30.0", target_is_directory=True)
    env = {"FIXPACK_CACHE": str(cache), "FIXPACK_OFFLINE": "1"}
    assert _fixpack("sources", "add", "vllm-gaudi", str(tmp_path / "stand-in"), env=env).returncode == 0
    for cmd in ("manifest", "lock"):
        r = _fixpack(cmd, "--profile", "v0.30.0", "--pack", str(pack), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    tree = tmp_path / "site-packages"
    assert _fixpack("sources", "tree", str(tree), "--profile", "v0.30.0", env=dict(env, FIXPACK_PACK=str(pack))).returncode == 0
    first = _launch_030(tree, pack, env)
    assert first.returncode == 0 and "launched" in first.stdout, first.stdout + first.stderr
    assert "vllm-long-prefill-share" in first.stdout and "glm47-streaming-text-markers" in first.stdout
    again = _launch_030(tree, pack, env)
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr
    v = _fixpack("verify", "--profile", "v0.30.0", "--root", str(tree), "--pack", str(pack), "--json", env=env)
    state = json.loads(v.stdout)
    assert v.returncode == 0 and state["drift"] is False and state["applied"]["opt_in"] == ["vllm-long-prefill-share", "glm47-streaming-text-markers"]
