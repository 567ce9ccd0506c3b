"""Pure-PyTorch emulations of the Gaudi bridge's fused kernels (plain CPU tensors in and out).

Each module's docstring names the vllm-gaudi call sites (v0.26.0, b059f9c) its semantics are
read from and what is assumed. ``hpu_emulation.ops.register()`` exposes them as
``torch.ops.hpu.*``.
"""

from .attention import fp8_sdpa_recomp_fwd, fused_sdpa, sdpa_recomp_fwd
from .block_softmax import block_softmax, block_softmax_adjustment
from .fp8 import cast_from_fp8, cast_to_fp8_v2, fp8_gemm_v2
from .moe import (
    mixture_of_experts,
    mixture_of_experts_bias_fused,
    mixture_of_experts_bias_mxfp4_fused,
    mixture_of_experts_fp8_fused,
    mixture_of_experts_fp8_fused_dynamic,
    mixture_of_experts_fused,
    mixture_of_experts_mxfp4_fused,
)
from .norm import rms_norm
from .quant import convert_from_uint4
from .rope import RotaryPosEmbeddingMode, rotary_pos_embedding

__all__ = [
    "RotaryPosEmbeddingMode",
    "block_softmax",
    "block_softmax_adjustment",
    "cast_from_fp8",
    "cast_to_fp8_v2",
    "convert_from_uint4",
    "fp8_gemm_v2",
    "fp8_sdpa_recomp_fwd",
    "fused_sdpa",
    "mixture_of_experts",
    "mixture_of_experts_bias_fused",
    "mixture_of_experts_bias_mxfp4_fused",
    "mixture_of_experts_fp8_fused",
    "mixture_of_experts_fp8_fused_dynamic",
    "mixture_of_experts_fused",
    "mixture_of_experts_mxfp4_fused",
    "rms_norm",
    "rotary_pos_embedding",
    "sdpa_recomp_fwd",
]
