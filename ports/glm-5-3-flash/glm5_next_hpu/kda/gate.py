"""The GLM forget gate and the q/k normalisation shared by every KDA form."""

import torch


def kda_gate(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float = -5.0) -> torch.Tensor:
    """Per-channel log-decay g in (lower_bound, 0).

    raw: [B, T, H*K] output of f_b_proj(f_a_proj(x)); A_log: [H] (flat, as on disk);
    dt_bias: [H*K]. Returns fp32 [B, T, H, K].

    GLM's gate is ``lower_bound * sigmoid(exp(A_log) * (raw + dt_bias))``: exp(A_log)
    sits *inside* the sigmoid. Kimi's ``-exp(A_log) * softplus(raw + dt_bias)`` is a
    different function (retention over 64 tokens differs by many orders of magnitude).
    """
    if lower_bound is None:
        raise ValueError("GLM-5.3-Flash uses the bounded gate; lower_bound=None (Kimi softplus) is not served")
    heads = A_log.numel()
    g = (raw.float() + dt_bias.float()).unflatten(-1, (heads, -1))
    return lower_bound * torch.sigmoid(A_log.float().exp()[:, None] * g)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # eps inside the sqrt (FLA convention), not max(norm, eps): matches the reference bit for bit.
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def l2norm_factor(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """1 / sqrt(sum x^2 + eps) over the last dim (keepdim): l2norm as a factor, so a kernel
    can fold it into the pass that copies x into its own layout."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().add_(eps).rsqrt_()
