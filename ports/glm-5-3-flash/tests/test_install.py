"""install.sh against a scratch tree of the real v0.26.0 release (`fixpack sources tree`).

install.sh --root DIR targets a folder holding vllm/ and vllm_gaudi/ instead of site-packages.
On the release it must apply the port (its four patches, then the profile's defaults), pass
its own final checks, and be a no-op the second time. On a tampered tree, or without the
kernel toolchain while the kernel is required, it must stop with a non-zero exit before it
changes anything.

The engine pins whole selections in profiles/v0.26.0.lock.json. When that lock does not yet
pin this port's selection (or the port's patches changed since), the test regenerates the lock
into a scratch copy of the pack and runs install.sh against that copy (COOKBOOK=...): the
committed lock is never written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PORT_DIR = Path(__file__).resolve().parents[1]
REPO = PORT_DIR.parents[1]
INSTALL = PORT_DIR / "install.sh"
PROFILE = "v0.26.0"
PORT = "glm-5-3-flash"

pytestmark = pytest.mark.release


def fixpack(*args, cwd=None, check=True, env=None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "fixpack", *args], capture_output=True, text=True, cwd=cwd, env=e)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"fixpack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return proc


def snapshot(tree: Path) -> dict[str, str]:
    out = {}
    for p in sorted(tree.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out[p.relative_to(tree).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def replace_file(path: Path, data: bytes) -> None:
    """The tree is hard-linked from the sources cache: replace by rename, never write through."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def lock_pins_port(pack: Path) -> bool:
    """The lock pins this port's selection with the port's current fix files."""
    try:  # the repository root is on sys.path through `pythonpath` in its pyproject.toml
        from fixpack.pack.pack import Pack

        p = Pack(pack)
        port = p.port(PORT)
        lock = json.loads((pack / "profiles" / f"{PROFILE}.lock.json").read_text())
        keys = {s["key"] for s in lock["selections"]}
        if f"{PORT}|" not in keys:
            return False
        return all(
            lock["fixes"].get(f.id, {}).get("hash") == f.content_hash()
            for f in p.selection(p.profile(PROFILE), [], port)
        )
    except Exception:
        return False


@pytest.fixture(scope="module")
def cookbook(tmp_path_factory) -> Path:
    """The pack install.sh uses: the repository, or a scratch copy with a regenerated lock."""
    if lock_pins_port(REPO):
        return REPO
    scratch = tmp_path_factory.mktemp("cookbook")
    shutil.copy2(REPO / "apply_all.py", scratch / "apply_all.py")  # a copy: apply_all finds its pack by realpath
    shutil.copytree(REPO / "profiles", scratch / "profiles")
    for name in ("fixpack", "fixes", "ports", "recipes"):
        if (REPO / name).exists():
            (scratch / name).symlink_to(REPO / name, target_is_directory=True)
    proc = fixpack("lock", "--profile", PROFILE, "--pack", str(scratch), check=False)
    if proc.returncode == 8 or "SourceUnavailable" in proc.stderr or "source unavailable" in proc.stderr:
        pytest.skip(f"release sources unavailable for the lock: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, f"fixpack lock on a scratch pack failed:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    return scratch


@pytest.fixture()
def tree(tmp_path) -> Path:
    dest = tmp_path / "site-packages"
    proc = fixpack("sources", "tree", str(dest), "--profile", PROFILE, check=False)
    if proc.returncode != 0:
        pytest.skip(
            f"release sources for {PROFILE} are unavailable (`fixpack sources tree` exited {proc.returncode}): {proc.stderr.strip()[-300:]}"
        )
    return dest


def install(cookbook: Path, tree: Path, *args, sinkhorn="torch") -> subprocess.CompletedProcess:
    env = dict(os.environ, COOKBOOK=str(cookbook), PYTHON=sys.executable, GLM5_NEXT_MHC_SINKHORN=sinkhorn)
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", str(INSTALL), "--root", str(tree), *args], capture_output=True, text=True, env=env, timeout=900
    )


def plugin_args() -> list[str]:
    # The plugin's packaging (ports/glm-5-3-flash/pyproject.toml) belongs to the model package.
    return [] if (PORT_DIR / "pyproject.toml").is_file() or (PORT_DIR / "setup.py").is_file() else ["--no-plugin"]


def toolchain_present() -> bool:
    return (
        subprocess.run(
            ["bash", str(PORT_DIR / "kernels" / "sinkhorn" / "build.sh"), "--check"], capture_output=True
        ).returncode
        == 0
    )


def test_installs_on_the_release_and_a_second_run_changes_nothing(cookbook, tree):
    before = snapshot(tree)
    proc = install(cookbook, tree, *plugin_args())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "port glm-5-3-flash installed" in proc.stdout

    # The port's four patches, then the profile's defaults, at their pins.
    report = fixpack("verify", "--profile", PROFILE, "--root", str(tree), "--pack", str(cookbook), "--json")
    state = json.loads(report.stdout)
    applied = [f["fix"] for f in state["fixes"]]
    assert applied[:4] == ["nope-mla-kpe-view", "kda-cache-group", "decode-layer-group", "hybrid-mla-no-value-cache"]
    assert all(f["status"] == "applied" for f in state["fixes"]) and state["drift"] is False
    assert state["applied"]["port"] == PORT

    after = snapshot(tree)
    changed = {rel for rel in before if before[rel] != after.get(rel)}
    assert "vllm_gaudi/attention/backends/hpu_attn.py" in changed
    assert "vllm_gaudi/extension/ops.py" in changed
    assert "vllm_gaudi/v1/worker/hpu_model_runner.py" in changed
    assert (
        "k_pe.view(k_c_normed.shape[0], 1, self.qk_rope_head_dim)"
        in (tree / "vllm_gaudi/attention/backends/hpu_attn.py").read_text()
    )
    if not plugin_args():
        assert any(p.name.startswith("glm5_next_hpu") for p in tree.iterdir()), "plugin not installed into --root"

    again = install(cookbook, tree, *plugin_args())
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "already applied" in again.stdout

    # The packages are byte-identical; the plugin's pip metadata (RECORD, direct_url.json) is
    # rewritten by pip on every install and is not compared.
    def code(snap):
        return {k: v for k, v in snap.items() if k.split("/", 1)[0] in ("vllm", "vllm_gaudi", "glm5_next_hpu")}

    assert code(snapshot(tree)) == code(after)


@pytest.mark.parametrize(
    "rel",
    ["vllm_gaudi/extension/ops.py", "vllm_gaudi/v1/core/sched/hpu_async_scheduler.py"],
    ids=["port-target", "profile-target"],
)
def test_a_tampered_tree_is_refused_and_left_as_it_was(cookbook, tree, rel):
    path = tree / rel
    replace_file(path, path.read_bytes() + b"\n# edited by hand\n")
    before = snapshot(tree)
    proc = install(cookbook, tree, *plugin_args())
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "not the stock vllm-gaudi v0.26.0 release" in proc.stderr or "drift" in proc.stderr, proc.stderr[-2000:]
    assert rel in proc.stdout + proc.stderr, "the refusal should name the file that is not pristine"
    assert snapshot(tree) == before
    assert not (tree / ".fixpack" / "state.json").exists()


def test_a_root_install_without_cookbook_serves_its_switches(cookbook, tree, tmp_path):
    """--root with COOKBOOK unset (it defaults to the checkout install.sh is in), and the installed
    plugin reads its switch declarations from itself: no checkout, no COOKBOOK, another cwd. The
    Sinkhorn switch is torch, which uses no kernel: the install does not stop for the toolchain."""
    env = dict(os.environ, PYTHON=sys.executable, GLM5_NEXT_MHC_SINKHORN="torch")
    for name in ("PYTHONPATH", "COOKBOOK"):
        env.pop(name, None)
    if cookbook != REPO:  # a scratch pack with a regenerated lock must be named
        env["COOKBOOK"] = str(cookbook)
    proc = subprocess.run(
        ["bash", str(INSTALL), "--root", str(tree)], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "port glm-5-3-flash installed" in proc.stdout
    if not toolchain_present():
        assert "no TPC toolchain: skipping the Sinkhorn kernel" in proc.stdout
    assert (tree / "glm5_next_hpu" / "port.yaml").read_bytes() == (PORT_DIR / "port.yaml").read_bytes()
    code = (
        "import glm5_next_hpu.switches as s; print(s.port_yaml()); "
        "print(s.read_switches({'GLM5_NEXT_MHC_SINKHORN': 'torch'}))"
    )
    serve_env = {k: v for k, v in os.environ.items() if k not in ("COOKBOOK", "PYTHONPATH")}
    serve_env["PYTHONPATH"] = str(tree)
    read = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=serve_env, cwd=tmp_path)
    assert read.returncode == 0, read.stderr[-2000:]
    assert read.stdout.splitlines()[0] == str(tree / "glm5_next_hpu" / "port.yaml")
    assert "mhc_sinkhorn='torch'" in read.stdout and "decode_layer_group=45" in read.stdout


def test_kernel_required_without_toolchain_stops_before_any_change(cookbook, tree):
    if toolchain_present():
        pytest.skip("a TPC toolchain is present here; the refusal path cannot be shown")
    before = snapshot(tree)
    proc = install(cookbook, tree, *plugin_args(), sinkhorn="kernel")
    assert proc.returncode == 20, (proc.stdout + proc.stderr)[-2000:]
    assert "GLM5_NEXT_MHC_SINKHORN=kernel needs the TPC toolchain" in proc.stderr
    assert snapshot(tree) == before


def test_the_image_build_context_holds_install_sh_and_the_steps_it_sources():
    """The Dockerfile copies the repository to /opt/gaudi-cookbook and runs install.sh there;
    install.sh sources scripts/port-install.sh, which the build context must not leave out."""
    import fnmatch

    text = (PORT_DIR / "Dockerfile").read_text()
    assert "COPY . /opt/gaudi-cookbook" in text and "bash ports/glm-5-3-flash/install.sh" in text
    assert "../../scripts/port-install.sh" in INSTALL.read_text()
    ignored = [
        line
        for line in (PORT_DIR / "Dockerfile.dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    for rel in ("apply_all.py", "ports/glm-5-3-flash/install.sh", "scripts/port-install.sh"):
        assert (REPO / rel).is_file(), rel
        assert not any(fnmatch.fnmatch(rel, pat) or rel.startswith(pat.rstrip("/") + "/") for pat in ignored), rel


def test_usage_errors_exit_2_before_anything_runs(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    bad = subprocess.run(["bash", str(INSTALL), "--bogus"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown argument --bogus" in bad.stderr
    no_dir = subprocess.run(
        ["bash", str(INSTALL), "--root", str(tmp_path / "absent")], capture_output=True, text=True, env=env
    )
    assert no_dir.returncode == 2 and "no such folder" in no_dir.stderr
    sinkhorn = subprocess.run(
        ["bash", str(INSTALL)], capture_output=True, text=True, env=dict(env, GLM5_NEXT_MHC_SINKHORN="auto")
    )
    assert sinkhorn.returncode == 2 and "GLM5_NEXT_MHC_SINKHORN=auto: expected kernel or torch" in sinkhorn.stderr
    helped = subprocess.run(["bash", str(INSTALL), "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0 and helped.stdout.startswith("# Install the GLM-5.3-Flash port")
