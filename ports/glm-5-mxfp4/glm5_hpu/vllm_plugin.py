"""vLLM general plugin of the glm-5-mxfp4 port.

Entry point (pyproject.toml)::

    [project.entry-points."vllm.general_plugins"]
    glm5_hpu = "glm5_hpu.vllm_plugin:register"

``vllm.plugins.load_general_plugins()`` calls :func:`register` in every vLLM process, so it is
cheap and idempotent. vLLM 0.30.0 has the model itself (``GlmMoeDsaForCausalLM`` and its MTP
draft ``DeepseekV32MTPModel``, generic implementation off CUDA); what it lacks is registered here:

* on CPU: the pieces vLLM's CPU platform does not have for this model (glm5_hpu/vllm_cpu.py):
  the MXFP4 MoE method for the converter's checkpoints (vLLM's ``Mxfp4MoEMethod`` has no CPU
  backend) and dense attention without the DSA indexer (vLLM's CPU platform refuses sparse
  attention). Both model classes are vLLM's own, subclassed. And the greedy rejection of
  speculative decoding in torch (vLLM's is a Triton kernel, which its CPU build cannot run).
* on HPU (vllm-gaudi's platform): vLLM's model with the router keys transformers' config lacks
  and the launch's switches checked (glm5_hpu/vllm_hpu.py); attention is vllm-gaudi's MLA backend
  and the MXFP4 experts go through vllm-gaudi's MXFP4 MoE op with the port's patches, with the
  GLM kernels for the calls GLM_MXK / GLM_MXK_PREFILL name (glm5_hpu/hpu_mxk.py). Importing
  glm5_hpu.vllm_hpu imports vLLM's model code: it is done when the platform is HPU only. Built and
  run on the profile's development base (vllm-gaudi main 091bbad with vLLM 0.27.0, whose MTP
  draft class is ``DeepSeekMTP``), on the Habana emulation only.

The MTP draft's architecture name depends on the vLLM release (``SpeculativeConfig.
hf_config_override``): vLLM 0.27.0 names glm_moe_dsa's draft ``DeepSeekMTPModel``, vLLM 0.30.0
(the serving page's pairing) ``DeepseekV32MTPModel``. Off CUDA both resolve to the same stock class
(``deepseek_mtp.DeepSeekMTP``), so the port's draft class serves both names; a name left out here
would be built as vLLM's stock class, without the draft's router keys, its residual shape and the
expert groups (tests/e2e/test_vllm030_architectures.py reads vLLM 0.30.0's registry and
speculative config and fails on a name the plugin does not register).

Classes are registered lazily (``"module:Class"``): nothing of the model is imported here.
"""

from __future__ import annotations

import logging

# a child of vLLM's "vllm" logger, whose handler vLLM configures: under our own name the lines
# never reached a server's log
logger = logging.getLogger(f"vllm.{__name__}")

#: architecture name -> lazy class path, registered on CPU only
CPU_ARCHITECTURES: dict[str, str] = {
    "GlmMoeDsaForCausalLM": "glm5_hpu.vllm_cpu:GlmMoeDsaCpuForCausalLM",
    "DeepseekV32MTPModel": "glm5_hpu.vllm_cpu:GlmMoeDsaCpuMTP",
}

#: architecture name -> lazy class path, registered on vllm-gaudi's platform (device type "hpu")
HPU_ARCHITECTURES: dict[str, str] = {
    "GlmMoeDsaForCausalLM": "glm5_hpu.vllm_hpu:GlmMoeDsaHpuForCausalLM",
    "DeepSeekMTPModel": "glm5_hpu.vllm_hpu:GlmMoeDsaHpuMTP",  # vLLM 0.27.0's name of the draft
    "DeepseekV32MTPModel": "glm5_hpu.vllm_hpu:GlmMoeDsaHpuMTP",  # vLLM 0.30.0's name of the draft
}

_registered = False


def register() -> None:
    """Register the port's pieces for the current platform (CPU or HPU). Safe to call again."""
    global _registered
    from vllm.platforms import current_platform

    if getattr(current_platform, "device_type", None) == "hpu":
        from vllm import ModelRegistry

        for arch, target in HPU_ARCHITECTURES.items():
            ModelRegistry.register_model(arch, target)
        from .vllm_hpu import register_quantization as register_hpu_quantization

        register_hpu_quantization()
        if not _registered:
            logger.info("glm5_hpu: registered the HPU model for %s", ", ".join(HPU_ARCHITECTURES))
        _registered = True
        return
    if not current_platform.is_cpu():
        return
    from vllm import ModelRegistry

    from .vllm_cpu import register_quantization, register_rejection_sampler

    for arch, target in CPU_ARCHITECTURES.items():
        ModelRegistry.register_model(arch, target)
    register_quantization()
    register_rejection_sampler()
    if not _registered:
        logger.info("glm5_hpu: registered the CPU pieces for %s and the mxfp4 MoE method", ", ".join(CPU_ARCHITECTURES))
    _registered = True
