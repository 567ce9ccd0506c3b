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

from packtests.builders import REPO
from packtests.recipes import rendered, seed_page

PORT = "glm-5-3-flash"

# Copied from the GLM-5.3-Flash serving page's launch block, character for character.
SEED_LINE = 'python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.26.0 glm47-streaming-text-markers || exit 1'

pytestmark = pytest.mark.release


def _fixpack(*args, env=None):
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "fixpack", *args], capture_output=True, text=True, env=e)


def test_the_copied_line_is_the_seeds_line():
    page = seed_page("000")
    if page is None:
        pytest.skip("the seeds folder is not beside this checkout")
    assert SEED_LINE in page.read_text().splitlines()


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
    assert fixes[:4] == ["nope-mla-kpe-view", "kda-cache-group", "decode-layer-group", "hybrid-mla-no-value-cache"]
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
PORT_030 = "glm-5-mxfp4"
SEED_LINE_030 = 'python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.30.0 \\\n    vllm-long-prefill-share glm47-streaming-text-markers || exit 1'


def test_the_copied_v030_line_is_the_seeds_line():
    page = seed_page("003")
    if page is None:
        pytest.skip("the seeds folder is not beside this checkout")
    assert SEED_LINE_030 in page.read_text()


@pytest.mark.parametrize("recipe, line", [("GLM-5.3-Flash", SEED_LINE), ("GLM-5.3-BF16", SEED_LINE_030)], ids=["v0.26.0", "v0.30.0"])
def test_each_recipe_renders_the_line_run_here(recipe, line):
    """What `fixpack recipe show` prints is the line these tests run verbatim."""
    assert f"\n{line}\n" in rendered(REPO / "recipes" / "zai-org" / recipe / "recipe.yaml")


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


@pytest.fixture(scope="module")
def pinned_030(tmp_path_factory):
    """(scratch pack pinning a stand-in for releases/v0.30.0, environment for fixpack there)."""
    from packtests.builders import stand_in_v030_pack

    tmp = tmp_path_factory.mktemp("pinned030")
    if _fixpack("sources", "tree", str(tmp / "dev"), "--profile", "v0.30.0").returncode != 0:
        pytest.skip("v0.30.0 sources unavailable")
    return stand_in_v030_pack(tmp / "dev", tmp)


def _tree_030(pinned, dest: Path) -> Path:
    pack, env = pinned
    assert _fixpack("sources", "tree", str(dest), "--profile", "v0.30.0", env=dict(env, FIXPACK_PACK=str(pack))).returncode == 0
    return dest


def _verify_030(tree: Path, pinned) -> dict:
    pack, env = pinned
    v = _fixpack("verify", "--profile", "v0.30.0", "--root", str(tree), "--pack", str(pack), "--json", env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    return json.loads(v.stdout)


def test_the_v030_line_runs_verbatim_once_the_release_is_pinned(pinned_030, tmp_path):
    """The stand-in release pinned with `fixpack manifest` and `fixpack lock`: the recipe's line
    applies, re-runs, and verify agrees."""
    pack, env = pinned_030
    tree = _tree_030(pinned_030, tmp_path / "site-packages")
    first = _launch_030(tree, pack, env)
    assert first.returncode == 0 and "launched" in first.stdout, first.stdout + first.stderr
    assert "vllm-long-prefill-share" in first.stdout and "glm47-streaming-text-markers" in first.stdout
    again = _launch_030(tree, pack, env)
    assert again.returncode == 0 and "already applied" in again.stdout, again.stdout + again.stderr
    state = _verify_030(tree, pinned_030)
    assert state["drift"] is False and state["applied"]["opt_in"] == ["vllm-long-prefill-share", "glm47-streaming-text-markers"]


def test_the_v030_line_runs_verbatim_after_the_ports_install_and_keeps_the_port(pinned_030, tmp_path):
    """The GLM-5.3 page's line in an image glm-5-mxfp4's install.sh --root prepared: it does not
    name the port, and the engine keeps the port the state record shows applied at image build."""
    import yaml

    pack, env = pinned_030
    tree = _tree_030(pinned_030, tmp_path / "site-packages")
    ienv = dict(os.environ, COOKBOOK=str(pack), PYTHON=sys.executable, GLM_MXK="0", GLM_MXK_PREFILL="0", **env)
    ienv.pop("PYTHONPATH", None)
    inst = subprocess.run(["bash", str(REPO / "ports" / PORT_030 / "install.sh"), "--root", str(tree), "--no-plugin"],
                          capture_output=True, text=True, env=ienv, timeout=900)
    assert inst.returncode == 0, (inst.stdout + inst.stderr)[-4000:]
    assert _verify_030(tree, pinned_030)["applied"]["port"] == PORT_030

    first = _launch_030(tree, pack, env)
    out = first.stdout + first.stderr
    assert first.returncode == 0 and "launched" in first.stdout, out[-4000:]
    assert f"keeping port {PORT_030}" in out
    state = _verify_030(tree, pinned_030)
    assert state["applied"]["port"] == PORT_030
    assert state["applied"]["opt_in"] == ["vllm-long-prefill-share", "glm47-streaming-text-markers"]
    patches = yaml.safe_load((REPO / "ports" / PORT_030 / "port.yaml").read_text())["patches"]
    fixes = [f["fix"] for f in state["fixes"]]
    assert fixes[: len(patches)] == patches  # the port's patches first, then the profile's fixes in pack order
    assert {"vllm-long-prefill-share", "glm47-streaming-text-markers"} <= set(fixes[len(patches):])
    assert state["drift"] is False and all(f["status"] == "applied" for f in state["fixes"])

    again = _launch_030(tree, pack, env)
    assert again.returncode == 0 and "launched" in again.stdout, (again.stdout + again.stderr)[-3000:]
    assert "already applied" in again.stdout and f"port {PORT_030} kept" in again.stdout
    assert _verify_030(tree, pinned_030)["fixes"] == state["fixes"]
