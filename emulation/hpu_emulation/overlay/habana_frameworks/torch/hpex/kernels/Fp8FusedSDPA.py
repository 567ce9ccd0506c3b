"""``habana_frameworks.torch.hpex.kernels.Fp8FusedSDPA``: ``fp8_fused_sdpa`` and the GQA helpers.

``fp8_fused_sdpa`` keyword names as ``extension/utils.py:ModuleFP8FusedSDPA.forward``
(vllm-gaudi v0.26.0) calls it; it returns the tuple of ``torch.ops.hpu.fp8_sdpa_recomp_fwd``
``(out, m, linv, amax_s, amax_o)``, of which the caller uses ``[0]``. ``is_gqa``,
``gqa_input_reshape_fwd``, ``gqa_output_reshape`` are imported by ``utils.py:SlicedFP8FusedSDPA``.
"""

import math

import torch

from hpu_emulation import ops as _ops
from hpu_emulation.kernels.attention import gqa_input_reshape_fwd, gqa_output_reshape, is_gqa

_ops.register()


def fp8_fused_sdpa(
    q,
    k,
    v,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    softmax_mode="None",
    d_scale_q=None,
    d_scale_k=None,
    d_scale_v=None,
    q_scale_s=None,
    q_scale_o=None,
    d_scale_s=None,
    is_amax_s=False,
    is_amax_o=False,
    valid_seq_len=None,
    seq_padding_type="left",
    window_size=None,
    sinks=None,
):
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if isinstance(window_size, int):
        window_size = [window_size, 0]
    return torch.ops.hpu.fp8_sdpa_recomp_fwd(
        q,
        k,
        v,
        attn_mask,
        float(dropout_p),
        float(scale),
        bool(is_causal),
        False,
        "None" if softmax_mode is None else str(softmax_mode),
        d_scale_q,
        d_scale_k,
        d_scale_v,
        q_scale_s,
        q_scale_o,
        d_scale_s,
        bool(is_amax_s),
        bool(is_amax_o),
        valid_seq_len,
        seq_padding_type,
        None if window_size is None else [int(x) for x in window_size],
        sinks,
    )


__all__ = ["fp8_fused_sdpa", "gqa_input_reshape_fwd", "gqa_output_reshape", "is_gqa"]
