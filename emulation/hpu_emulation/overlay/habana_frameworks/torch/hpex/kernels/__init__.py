"""``habana_frameworks.torch.hpex.kernels``: what vllm-gaudi v0.26.0 imports from here.

``FusedSDPA`` (``extension/kernels.py``, ``models/pixtral.py``, ``models/qwen2_5_vl.py``),
``fp8_fused_sdpa`` (``attention/backends/hpu_attn.py``), ``RotaryPosEmbeddingMode`` and
``apply_rotary_pos_emb`` (``ops/hpu_rotary_embedding.py``). Thin wrappers over
``torch.ops.hpu.*``: no host syncs, no data-dependent shapes.
"""

import torch

from hpu_emulation import ops as _ops
from hpu_emulation.kernels.rope import RotaryPosEmbeddingMode

from .Fp8FusedSDPA import fp8_fused_sdpa
from .FusedSDPA import FusedSDPA

_ops.register()


def apply_rotary_pos_emb(p, cos, sin, position_ids=None, offset=0, mode=RotaryPosEmbeddingMode.BLOCKWISE):
    """``p * cos + rotate(p) * sin``; mode BLOCKWISE rotates halves (NeoX), PAIRWISE pairs (GPT-J).

    Positional order as ``ops/hpu_rotary_embedding.py`` calls it: ``(x, cos, sin, None, 0, mode)``.
    """
    return torch.ops.hpu.rotary_pos_embedding(p, sin, cos, position_ids, int(offset), int(mode))


__all__ = ["FusedSDPA", "RotaryPosEmbeddingMode", "apply_rotary_pos_emb", "fp8_fused_sdpa"]
