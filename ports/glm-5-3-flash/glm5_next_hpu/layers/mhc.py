"""The decoder layer's manifold hyper-connection parameters (the math is ``glm5_next_hpu.mhc``).

Both halves of a layer (attention, then FFN) mix the hc_mult streams with their own
projection ``fn`` [(2 + n) n, n D], bias ``base`` [(2 + n) n] and three scales ``scale``
[3], all fp32. They sit on the layer itself under their checkpoint names
(``layers.{i}.hc_attn_fn`` ...).
"""

import torch
import torch.nn as nn


class MhcLayer(nn.Module):
    """A decoder layer holding the six parameters ``add_mhc_parameters`` sets (declared here so
    they read as tensors, not as ``nn.Module.__getattr__``'s tensor-or-module)."""

    hc_attn_fn: nn.Parameter
    hc_attn_base: nn.Parameter
    hc_attn_scale: nn.Parameter
    hc_ffn_fn: nn.Parameter
    hc_ffn_base: nn.Parameter
    hc_ffn_scale: nn.Parameter


def add_mhc_parameters(layer: nn.Module, config, requires_grad: bool = True) -> None:
    """Give ``layer`` its six mHC parameters, zero projections and biases, unit scales."""
    n = config.hc_mult
    width, streams = (2 + n) * n, n * config.hidden_size
    f32 = torch.float32
    layer.hc_attn_fn = nn.Parameter(torch.zeros(width, streams, dtype=f32), requires_grad=requires_grad)
    layer.hc_attn_base = nn.Parameter(torch.zeros(width, dtype=f32), requires_grad=requires_grad)
    layer.hc_attn_scale = nn.Parameter(torch.ones(3, dtype=f32), requires_grad=requires_grad)
    layer.hc_ffn_fn = nn.Parameter(torch.zeros(width, streams, dtype=f32), requires_grad=requires_grad)
    layer.hc_ffn_base = nn.Parameter(torch.zeros(width, dtype=f32), requires_grad=requires_grad)
    layer.hc_ffn_scale = nn.Parameter(torch.ones(3, dtype=f32), requires_grad=requires_grad)
