"""install.sh (and the Dockerfile that runs it) against scratch trees of the real v0.30.0 sources.

install.sh --root DIR targets a folder holding vllm/ and vllm_gaudi/ instead of site-packages.

The committed v0.30.0 lock pins vllm-gaudi only on its development base (main 091bbad; the
releases/v0.30.0 commit 058f107 is not fetchable here), and fixpack refuses an image pinned that
way: install.sh must stop on such a pack with nothing changed. To show the install itself, the
tests make a stand-in for releases/v0.30.0 (the development base plus a file no fix touches),
pin it with `fixpack manifest` and `fixpack lock` in a scratch copy of the pack (as the v0.30.0
launch-line test does), and install into a tree of it: the port's patches then the profile's
defaults applied, its final checks passed, a second run a no-op; a tampered tree, the kernels
required (GLM_MXK=1: built first; this machine cannot build them) and a plugin with no entry point each stop before any change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PORT_DIR = Path(__file__).resolve().parents[1]
REPO = PORT_DIR.parents[1]
INSTALL = PORT_DIR / "install.sh"
PROFILE = "v0.30.0"
PORT = "glm-5-mxfp4"
PATCHES = yaml.safe_load((PORT_DIR / "port.yaml").read_text())["patches"]

pytestmark = pytest.mark.release


def fixpack(*args, env=None, check=True) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "fixpack", *args], capture_output=True, text=True, env=e)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"fixpack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return proc


def snapshot(tree: Path) -> dict[str, str]:
    return {
        p.relative_to(tree).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def replace_file(path: Path, data: bytes) -> None:
    """Trees are hard-linked from the sources cache: replace by rename, never write through."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def has_entry_point() -> bool:
    return "vllm.general_plugins" in (PORT_DIR / "pyproject.toml").read_text()


def install(cookbook: Path, tree: Path, *args, env=None, mxk="0") -> subprocess.CompletedProcess:
    e = dict(os.environ, COOKBOOK=str(cookbook), PYTHON=sys.executable, GLM_MXK=mxk, GLM_MXK_PREFILL=mxk, **(env or {}))
    e.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", str(INSTALL), "--root", str(tree), *args], capture_output=True, text=True, env=e, timeout=900
    )


def plugin_args() -> list[str]:
    # The entry point belongs to the vLLM model (not written yet): install the patches only until then.
    return [] if has_entry_point() else ["--no-plugin"]


@pytest.fixture(scope="module")
def dev_tree(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("dev") / "site-packages"
    proc = fixpack("sources", "tree", str(tree), "--profile", PROFILE, check=False)
    if proc.returncode != 0:
        pytest.skip(f"release sources for {PROFILE} are unavailable: {proc.stderr.strip()[-300:]}")
    return tree


@pytest.fixture(scope="module")
def pinned(tmp_path_factory, dev_tree):
    """(scratch pack pinning a stand-in releases/v0.30.0, environment for fixpack there)."""
    from packtests.builders import stand_in_v030_pack

    return stand_in_v030_pack(dev_tree, tmp_path_factory.mktemp("pinned"))


@pytest.fixture()
def tree(pinned, tmp_path) -> Path:
    pack, env = pinned
    dest = tmp_path / "site-packages"
    fixpack("sources", "tree", str(dest), "--profile", PROFILE, env=dict(env, FIXPACK_PACK=str(pack)))
    return dest


def test_the_committed_pack_refuses_a_tree_it_pins_only_on_the_development_base(dev_tree, tmp_path):
    lock = json.loads((REPO / "profiles" / f"{PROFILE}.lock.json").read_text())
    if lock["bases"]["vllm_gaudi"]["base"] != "development":
        pytest.skip("this pack's v0.30.0 lock pins the vllm-gaudi release itself")
    tree = tmp_path / "site-packages"
    shutil.copytree(dev_tree, tree, copy_function=os.link)
    before = snapshot(tree)
    proc = install(REPO, tree, "--no-plugin")
    assert proc.returncode not in (0, 1), proc.stdout[-2000:]
    assert "pins it only on its development base" in proc.stderr and "nothing was changed" in proc.stderr, proc.stderr[
        -2000:
    ]
    assert snapshot(tree) == before and not (tree / ".fixpack").exists()


def test_installs_on_the_pinned_release_and_a_second_run_changes_nothing(pinned, tree):
    pack, env = pinned
    before = snapshot(tree)
    proc = install(pack, tree, *plugin_args(), env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"port {PORT} installed (MXFP4 MoE: vllm-gaudi's stock op" in proc.stdout

    report = fixpack("verify", "--profile", PROFILE, "--root", str(tree), "--pack", str(pack), "--json", env=env)
    state = json.loads(report.stdout)
    applied = [f["fix"] for f in state["fixes"]]
    assert applied[: len(PATCHES)] == PATCHES  # the port's patches, then the profile's defaults
    assert len(applied) > len(PATCHES)
    assert all(f["status"] == "applied" for f in state["fixes"]) and state["drift"] is False
    assert state["applied"]["port"] == PORT

    after = snapshot(tree)
    changed = {rel for rel in before if before[rel] != after.get(rel)}
    assert {"vllm_gaudi/v1/spec_decode/hpu_eagle.py", "vllm_gaudi/ops/hpu_mxfp4.py"} <= changed
    assert "model_returns_tuple" in (tree / "vllm_gaudi/v1/spec_decode/hpu_eagle.py").read_text()

    again = install(pack, tree, *plugin_args(), env=env)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "already applied" in again.stdout

    def code(snap):
        return {k: v for k, v in snap.items() if k.split("/", 1)[0] in ("vllm", "vllm_gaudi", "glm5_hpu", "glm5_mxfp4")}

    assert code(snapshot(tree)) == code(after)


@pytest.mark.parametrize(
    "rel",
    ["vllm_gaudi/ops/hpu_mxfp4.py", "vllm/v1/executor/multiproc_executor.py"],
    ids=["port-target", "profile-target"],
)
def test_a_tampered_tree_is_refused_and_left_as_it_was(pinned, tree, rel):
    pack, env = pinned
    path = tree / rel
    replace_file(path, path.read_bytes() + b"\n# edited by hand\n")
    before = snapshot(tree)
    proc = install(pack, tree, "--no-plugin", env=env)
    assert proc.returncode not in (0, 1), proc.stdout[-2000:]
    assert "not the stock vllm-gaudi v0.30.0 release" in proc.stderr or "drift" in proc.stderr, proc.stderr[-2000:]
    assert rel in proc.stdout + proc.stderr, "the refusal should name the file that is not pristine"
    assert snapshot(tree) == before and not (tree / ".fixpack" / "state.json").exists()


def test_kernels_required_but_not_buildable_here_stop_before_any_change(pinned, tree):
    # GLM_MXK=1: the install builds the kernels first; this machine has no TPC toolchain (build.sh exit 3)
    pack, env = pinned
    assert (PORT_DIR / "kernels" / "mxfp4-moe" / "build.sh").exists()
    before = snapshot(tree)
    proc = install(pack, tree, "--no-plugin", env=env, mxk="1")
    assert proc.returncode == 20, (proc.stdout + proc.stderr)[-2000:]
    assert "need the MXFP4 MoE kernels" in proc.stderr and "could not build them here (exit 3" in proc.stderr
    assert "Nothing was changed" in proc.stderr
    assert snapshot(tree) == before


def test_a_plugin_without_its_entry_point_stops_before_any_change(pinned, tree):
    if has_entry_point():
        pytest.skip("the port declares its vllm.general_plugins entry point; the install test installs it")
    pack, env = pinned
    before = snapshot(tree)
    proc = install(pack, tree, env=env)
    assert proc.returncode == 22, (proc.stdout + proc.stderr)[-2000:]
    assert "declares no vllm.general_plugins entry point" in proc.stderr
    assert snapshot(tree) == before


def test_bad_switch_values_are_usage_errors(tmp_path):
    proc = install(REPO, tmp_path, "--no-plugin", mxk="auto")
    assert proc.returncode == 2 and "GLM_MXK=auto" in proc.stderr


def test_the_dockerfile_installs_this_port_where_the_recipe_expects_it():
    text = (PORT_DIR / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE$", text, re.M) and re.search(r"^FROM \$\{BASE\}$", text, re.M)
    # the launch block's paths are "$COOKBOOK/...": the image's COOKBOOK is where the repository is copied
    assert "ENV COOKBOOK=/opt/gaudi-cookbook" in text and "COPY . /opt/gaudi-cookbook" in text
    assert "bash ports/glm-5-mxfp4/install.sh" in text
    for arg in ("GLM_MXK", "GLM_MXK_PREFILL"):
        assert f"ARG {arg}=1" in text and f"{arg}=${{{arg}}}" in text  # as served, unless the build says otherwise
    ignored = [
        line
        for line in (PORT_DIR / "Dockerfile.dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    needed = [
        "apply_all.py",
        "fixes/apply_all.py",
        "profiles/v0.30.0.yaml",
        "fixpack/__init__.py",
        "ports/glm-5-mxfp4/port.yaml",
        "ports/glm-5-mxfp4/install.sh",
        "scripts/port-install.sh",
        "ports/glm-5-mxfp4/glm5_hpu/switches.py",
        "fixes/vllm-long-prefill-share",
    ]
    import fnmatch

    for rel in needed:
        assert (REPO / rel).exists(), rel
        assert not any(fnmatch.fnmatch(rel, pat) or rel.startswith(pat.rstrip("/") + "/") for pat in ignored), rel


def test_install_sh_is_shellcheck_clean_and_in_the_hook():
    hook = (REPO / ".pre-commit-config.yaml").read_text()
    assert re.search(r"files: .*ports/glm-5-mxfp4/install\\\.sh", hook)
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([shellcheck, str(INSTALL)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
