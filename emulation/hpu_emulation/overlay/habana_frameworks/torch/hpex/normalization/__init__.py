"""``habana_frameworks.torch.hpex.normalization``: ``FusedRMSNorm``.

``vllm_gaudi/ops/hpu_layernorm.py`` (v0.26.0) calls ``FusedRMSNorm.apply(x, weight, eps)``;
forward is one ``torch.ops.hpu.rms_norm`` call (semantics in ``hpu_emulation/kernels/norm.py``).
"""

import torch

from hpu_emulation import ops as _ops

_ops.register()


class FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, data_in, gamma, eps=1e-6, *args):
        if args:
            raise NotImplementedError(f"FusedRMSNorm emulation: extra arguments {args!r}")
        return torch.ops.hpu.rms_norm(data_in, gamma, float(eps))

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("FusedRMSNorm emulation: backward (inference only)")


__all__ = ["FusedRMSNorm"]
