"""Token-by-token KDA recurrence in float64: the oracle every fast form is tested against.

The transformers reference computes in fp32 internally, so a ``.double()`` reference
model is not a float64 oracle; this function is.
"""

import torch

from .gate import l2norm


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = True,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, g: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; state [B, H, K, V].

    Per step: S <- diag(exp(g_t)) S; S <- S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t / sqrt(K).
    Returns (o [B, T, H, V] in ``dtype``, final state [B, H, K, V] in ``dtype``).
    """
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    B, T, H, K = k.shape
    V = v.shape[-1]
    q = q * K**-0.5
    S = torch.zeros(B, H, K, V, dtype=dtype) if initial_state is None else initial_state.to(dtype).clone()
    o = torch.zeros(B, T, H, V, dtype=dtype)
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, S
