"""vLLM general plugin: register GLM-5.3-Flash with vLLM's ModelRegistry.

Entry point (pyproject.toml)::

    [project.entry-points."vllm.general_plugins"]
    glm5_next_hpu = "glm5_next_hpu.vllm_plugin:register"

``vllm.plugins.load_general_plugins()`` calls :func:`register` in every vLLM process (API
server, engine core, every worker), so it must be cheap, side-effect free beyond the
registry, and idempotent. The model class is registered in the lazy ``"module:Class"``
string form: nothing of the model (or of torch kernels) is imported until vLLM builds it.

Source patches are NOT applied from here: a plugin runs after vLLM's modules are imported,
so editing their files would not change the running process.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

#: architecture name (config.json "architectures") -> lazy class path
ARCHITECTURES: dict[str, str] = {
    "Glm5NextForConditionalGeneration": "glm5_next_hpu.vllm.model:Glm5NextForConditionalGeneration",
}

_registered = False


def register() -> None:
    """Register the GLM-5.3-Flash architecture(s) with vLLM. Safe to call any number of times."""
    global _registered
    from vllm import ModelRegistry

    for arch, target in ARCHITECTURES.items():
        current = ModelRegistry.models.get(arch) if hasattr(ModelRegistry, "models") else None
        if current is not None and _is_ours(current, target):
            continue  # already registered (this process called register() before)
        ModelRegistry.register_model(arch, target)
    # A transformers without glm5_next (the stock image's 5.14.1) gets the port's config classes,
    # before vLLM parses the checkpoint's config.json (general plugins load first).
    from .hf_configs import register_configs

    register_configs()
    from .vllm.fp8_config import register as register_fp8_reference

    register_fp8_reference()  # block-FP8 checkpoints on CPU: dequantized at load (see fp8_config.py)
    if not _registered:
        logger.debug("glm5_next_hpu: registered %s", ", ".join(ARCHITECTURES))
    _registered = True


def _is_ours(entry, target: str) -> bool:
    module, _, cls = target.partition(":")
    return getattr(entry, "module_name", None) == module and getattr(entry, "class_name", None) == cls
