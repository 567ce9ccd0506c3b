"""vLLM quantization config of the CPU reference path for block-FP8 GLM-5.3-Flash checkpoints.

Why a config of its own: vLLM 0.26.0's ``Fp8Config`` on CPU builds ``Fp8LinearMethod``, whose only
CPU kernel (``CPUFp8BlockScaledMMKernel``, W8A16 block GEMM) needs AMX tiles (Sapphire Rapids or
newer) and K-blocks of 128; elsewhere it stops at layer construction ("Failed to find a kernel that
can implement the ScaledMM linear layer"). ``Fp8MoEMethod``'s CPU experts (``CPUExpertsFp8``) take
128-blocks only and plain SiLU (no SwiGLU clamp). ``Fp8Config`` also accepts only bf16/fp16
activations, so an fp32 run (the port's exact-parity tests) is refused outright.

So on the CPU platform, for a ``glm5_next`` checkpoint whose quantization_config says fp8, the
plugin's :class:`Glm5NextFp8ReferenceConfig` takes over through vLLM's
``override_quantization_method`` hook: every linear and MoE layer gets vLLM's *unquantized* method
(parameters in the model dtype) and the plugin's loader dequantizes each FP8 weight with its block
scale at load (``fp8.py``). That is a reference path -- BF16/fp32 compute on dequantized weights,
no FP8 GEMM -- and is logged as such. On other platforms (HPU) it does not claim the checkpoint;
vLLM's own ``Fp8Config`` is built and reaches the model's projections (``layer_quant_config``):
vLLM's FP8 linear method (vllm-gaudi's on HPU) makes their FP8 weights and block scales, which the
loader fills with the checkpoint's bytes. On both platforms the routed experts are the port's loop
(vLLM's FP8 MoE drops the SwiGLU clamp), holding the FP8 bytes and block scales at rest and
dequantizing per chunk of experts right before each matmul (``parallel.ParallelExperts``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase

from .fp8 import BlockFp8Spec

logger = logging.getLogger(__name__)

NAME = "glm5_next_fp8_reference"


class Glm5NextFp8ReferenceConfig(QuantizationConfig):
    def __init__(self, spec: BlockFp8Spec):
        super().__init__()
        self.spec = spec

    @classmethod
    def get_name(cls) -> str:  # a custom method name (vLLM's Literal lists built-ins only)
        return NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @classmethod
    def get_config_filenames(cls) -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Glm5NextFp8ReferenceConfig:
        spec = BlockFp8Spec.from_quantization_config(config)
        logger.info(
            "glm5_next_hpu: block-FP8 checkpoint (blocks %s) on CPU: reference path -- each FP8 weight is "
            "dequantized with its block scale at load; no FP8 kernel runs",
            list(spec.block),
        )
        return cls(spec)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        from vllm.platforms import current_platform

        model_type = getattr(hf_config, "model_type", None)
        if (
            current_platform.is_cpu()
            and model_type == "glm5_next"
            and isinstance(hf_quant_cfg, dict)
            and hf_quant_cfg.get("quant_method") == "fp8"
            and user_quant in (None, "fp8", NAME)
        ):
            return NAME
        return None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        from vllm.model_executor.layers.fused_moe import RoutedExperts, UnquantizedFusedMoEMethod
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        if isinstance(layer, RoutedExperts):
            return UnquantizedFusedMoEMethod(layer.moe_config)
        return None


def register() -> None:
    """Make the config known to vLLM (idempotent; called by the plugin entry point)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    if NAME not in QUANTIZATION_METHODS:
        register_quantization_config(NAME)(Glm5NextFp8ReferenceConfig)


def _is_vllm_fp8(quant_config) -> bool:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    return isinstance(quant_config, Fp8Config)


def checkpoint_fp8_spec(quant_config) -> BlockFp8Spec | None:
    """What the model's loader needs from vLLM's quant config: the block-FP8 spec (the reference
    path's own, or read from vLLM's ``Fp8Config`` -- the HPU path), None for an unquantized
    checkpoint. Any other quant config, and an ``Fp8Config`` that is not block FP8 from an FP8
    checkpoint with dynamic activations, is refused at construction rather than loaded wrongly."""
    from ..config import UnsupportedConfigError

    if quant_config is None:
        return None
    if isinstance(quant_config, Glm5NextFp8ReferenceConfig):
        return quant_config.spec
    if _is_vllm_fp8(quant_config):
        qc = quant_config
        if not qc.is_checkpoint_fp8_serialized or qc.weight_block_size is None or qc.activation_scheme != "dynamic":
            raise UnsupportedConfigError(
                f"fp8 quantization: checkpoint serialized in FP8 {qc.is_checkpoint_fp8_serialized}, weight_block_size "
                f"{qc.weight_block_size}, activation_scheme {qc.activation_scheme!r}; only block-FP8 checkpoints with "
                "dynamic activations (the published GLM-5.3-Flash FP8) are served"
            )
        return BlockFp8Spec.from_quantization_config(
            {
                "quant_method": "fp8",
                "weight_block_size": list(qc.weight_block_size),
                "modules_to_not_convert": list(qc.ignored_layers),
            },
            source="vLLM Fp8Config",
        )
    raise UnsupportedConfigError(
        f"quantization {quant_config.get_name()!r}: the plugin serves unquantized and block-FP8 checkpoints only"
    )


def layer_quant_config(quant_config):
    """The config the model's projections are built with: vLLM's ``Fp8Config`` (its FP8 linear
    method makes their parameters), or None -- an unquantized checkpoint, and the reference path,
    whose layers stay in the model dtype and get their weights dequantized at load."""
    checkpoint_fp8_spec(quant_config)  # refuses what is not served
    return quant_config if quant_config is not None and _is_vllm_fp8(quant_config) else None
