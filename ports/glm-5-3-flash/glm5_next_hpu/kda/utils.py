"""Helpers every KDA form shares: q/k normalisation, the default scale, padding removal."""

import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim.

    eps inside the sqrt (flash-linear-attention's convention), not max(norm, eps): this
    matches the transformers reference bit for bit.
    """
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def l2norm_factor(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """1 / sqrt(sum x^2 + eps) over the last dim (keepdim): :func:`l2norm` as a factor, so a
    kernel can fold it into the pass that copies x into its own layout."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().add_(eps).rsqrt_()


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """The query scale: ``scale`` when given, else 1 / sqrt(K)."""
    return head_dim**-0.5 if scale is None else float(scale)


def mask_inputs(mask, q, k, v, g, beta):
    """q, k, v, g, beta with every padded position ([B, T] mask, True = real token) set to 0.

    g = 0 and beta = 0 make a padded step the identity on the state. torch.where, not a
    multiply: 0 * NaN is NaN, and a NaN in one padded slot would otherwise poison the state
    of every later token.
    """
    m = mask.bool()
    m4 = m[:, :, None, None]
    zero = q.new_zeros(())
    return (
        torch.where(m4, q, zero),
        torch.where(m4, k, zero),
        torch.where(m4, v, zero),
        torch.where(m4, g, zero),
        torch.where(m[:, :, None], beta, zero),
    )
