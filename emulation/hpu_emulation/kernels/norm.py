"""FusedRMSNorm.

Call site: ``vllm_gaudi/ops/hpu_layernorm.py:HPURMSNorm.forward_oot`` (b059f9c) calls
``FusedRMSNorm.apply(x, weight, eps)`` (with ``weight + 1`` for Gemma), replacing vLLM's
``RMSNorm.forward_native``: ``x * rsqrt(mean(x**2, -1) + eps) * weight``.

Assumed: the whole computation is in float32 and rounded once to x's dtype at the end (vLLM's
native version rounds the normalised x to x's dtype before the weight multiply; in bf16 the two
differ by about one bf16 ulp).
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * weight`` over the last dim, in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)
