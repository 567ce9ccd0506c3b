"""The GLM forget gate and the gated RMSNorm on the KDA output."""

import torch


def kda_gate(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float = -5.0) -> torch.Tensor:
    """Per-channel log-decay g in (lower_bound, 0).

    Args:
        raw: [B, T, H*K] (or [T, H*K]), the output of f_b_proj(f_a_proj(x)).
        A_log: [H] (flat, as on disk; any shape with H elements).
        dt_bias: [H*K].
        lower_bound: the gate's lower bound (GLM: -5).

    Returns fp32 g, the last dim split into [H, K].

    GLM's gate is ``lower_bound * sigmoid(exp(A_log) * (raw + dt_bias))``: exp(A_log)
    sits *inside* the sigmoid. Kimi's ``-exp(A_log) * softplus(raw + dt_bias)`` is a
    different function (retention over 64 tokens differs by many orders of magnitude).
    """
    if lower_bound is None:
        raise ValueError("GLM-5.3-Flash uses the bounded gate; lower_bound=None (Kimi softplus) is not served")
    heads = A_log.numel()
    g = (raw.float() + dt_bias.float()).unflatten(-1, (heads, -1))
    return lower_bound * torch.sigmoid(A_log.float().reshape(-1).exp()[:, None] * g)


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rmsnorm(o) * sigmoid(gate) over the last dim (head_dim), in fp32.

    Args:
        o: [..., K], the KDA output per head.
        gate: [..., K], the output gate (g_b_proj(g_a_proj(x)) per head) before its sigmoid.
        weight: [K], o_norm's weight.
        eps: o_norm's epsilon.

    Returns fp32 [..., K]; the caller casts to the activation dtype before o_proj.
    """
    of = o.float()
    of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)
    return weight.float() * of * torch.sigmoid(gate.float())
