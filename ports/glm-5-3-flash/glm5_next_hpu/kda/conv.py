"""Depthwise causal short conv (kernel 4) over the concatenated q|k|v channels, with state."""

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [B, C, T]; weight: [C, W]; conv_state: [B, C, W-1] (the previous W-1 inputs) or None.

    Returns (silu(conv(x)) [B, C, T], new conv_state [B, C, W-1]). The new state is built
    as a fresh tensor; a caller that owns a cache writes it back with one whole-tensor copy_.
    """
    width = weight.shape[-1]
    if conv_state is None:
        conv_state = x.new_zeros(x.shape[0], x.shape[1], width - 1)
    full = torch.cat([conv_state.to(x.dtype), x], dim=-1)
    out = F.conv1d(full.to(weight.dtype), weight.unsqueeze(1), groups=x.shape[1])
    return F.silu(out).to(x.dtype), full[:, :, -(width - 1) :]


def causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: x [B, C, 1]. Same contract as :func:`causal_conv1d`."""
    return causal_conv1d(x, weight, conv_state)
