"""``habana_frameworks.torch.hpex.kernels.FusedSDPA``: the FusedSDPA autograd function (forward only).

Signature as vllm-gaudi v0.26.0 calls it (``extension/utils.py:ModuleFusedSDPA.forward``,
``extension/ops.py:_fsdpa_prompt_attention``, ``tests/unit_tests/test_fsdpa_slicing.py``):
``FusedSDPA.apply(q, k, v, attn_mask, dropout_p, is_causal, scale, softmax_mode,
recompute_mode, valid_sequence_lengths, padding_side, <False>, <False>, window_size, sinks)``.
The two flags after ``padding_side`` are passed as ``False`` and their names are not public;
they are accepted as ``flag_11`` / ``flag_12`` and anything but False raises
NotImplementedError. Also ``is_gqa``, ``gqa_input_reshape_fwd``, ``gqa_output_reshape``
(imported by ``utils.py:SlicedFusedSDPA``). The forward is one ``torch.ops.hpu.sdpa_recomp_fwd``
call; semantics in ``hpu_emulation/kernels/attention.py``.
"""

import math

import torch

from hpu_emulation import ops as _ops
from hpu_emulation.kernels.attention import gqa_input_reshape_fwd, gqa_output_reshape, is_gqa

_ops.register()


def _window_arg(window_size):
    if window_size is None:
        return None
    if isinstance(window_size, int):
        return [window_size, 0]
    return [int(x) for x in window_size]


class FusedSDPA(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        softmax_mode="None",
        recompute_mode=None,
        valid_sequence_lengths=None,
        padding_side="left",
        flag_11=False,
        flag_12=False,
        window_size=None,
        sinks=None,
    ):
        if flag_11 or flag_12:
            raise NotImplementedError("FusedSDPA emulation: the two flags after padding_side other than False")
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.ops.hpu.sdpa_recomp_fwd(
            q,
            k,
            v,
            attn_mask,
            float(dropout_p),
            float(scale),
            bool(is_causal),
            False,
            "None" if softmax_mode is None else str(softmax_mode),
            valid_sequence_lengths,
            padding_side,
            _window_arg(window_size),
            sinks,
        )[0]
        return out

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("FusedSDPA emulation: backward (inference only)")


__all__ = ["FusedSDPA", "gqa_input_reshape_fwd", "gqa_output_reshape", "is_gqa"]
