"""The readable KDA forms, in float64: the oracles every fast form is tested against.

``naive_recurrent_kda`` is the token-by-token recurrence. ``naive_chunk_kda`` is the chunk
algorithm of ``chunk.py``'s docstring written out directly: the all-pairs decay tensor,
one triangular solve, one loop over chunks; no memory planning. A test that compares the
fast chunk form with both can tell an algorithm error from a buffer-schedule error.

The transformers reference computes in fp32 internally, so a ``.double()`` reference
model is not a float64 oracle; these functions are.
"""

import torch
import torch.nn.functional as F

from .utils import l2norm, mask_inputs, resolve_scale


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, mask):
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if mask is not None:
        q, k, v, g, beta = mask_inputs(mask, q, k, v, g, beta)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    return q * resolve_scale(scale, q.shape[-1]), k, v, g, beta


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The KDA recurrence, one token at a time, in float64.

    Per step: S <- diag(exp(g_t)) S; S <- S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T (scale q_t).

    Args:
        q: [B, T, H, K] queries.
        k: [B, T, H, K] keys.
        v: [B, T, H, V] values.
        g: [B, T, H, K] per-channel log-decay (<= 0).
        beta: [B, T, H] write strength in (0, 1).
        scale: query scale; None means K ** -0.5.
        initial_state: [B, H, K, V] state before the first token, or None for zeros.
        output_final_state: return the state after the last token.
        use_qk_l2norm_in_kernel: l2-normalise q and k over K first.
        mask: [B, T] bool, True = real token; a padded position is an identity step.

    Returns (o [B, T, H, V], final state [B, H, K, V] or None), both float64.
    """
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, mask)
    B, T, H, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.double().clone()
    o = q.new_zeros(B, T, H, v.shape[-1])
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, (S if output_final_state else None)


def naive_chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    mask: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunk form of KDA, as the equations in ``chunk.py``'s docstring, in float64.

    Args:
        q: [B, T, H, K] queries.
        k: [B, T, H, K] keys.
        v: [B, T, H, V] values.
        g: [B, T, H, K] per-channel log-decay (<= 0).
        beta: [B, T, H] write strength in (0, 1).
        scale: query scale; None means K ** -0.5.
        initial_state: [B, H, K, V] state before the first token, or None for zeros.
        output_final_state: return the state after the last token.
        use_qk_l2norm_in_kernel: l2-normalise q and k over K first.
        mask: [B, T] bool, True = real token; a padded position is an identity step.
        chunk_size: C, tokens per chunk.

    Returns (o [B, T, H, V], final state [B, H, K, V] or None), both float64.
    """
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, mask)
    B, T, H, K = k.shape
    C = chunk_size
    pad = -T % C  # zero steps (g = beta = 0) at the end are the identity
    q, k, v, g, beta = (F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) for x in (q, k, v, g, beta))
    # [B, H, N, C, X]: chunk n holds tokens n*C .. n*C + C - 1.
    q, k, v, g = (x.transpose(1, 2).unflatten(2, (-1, C)) for x in (q, k, v, g))
    beta = beta.transpose(1, 2).unflatten(2, (-1, C))[..., None]
    G = g.cumsum(-2)  # G_i = g_1 + ... + g_i inside the chunk
    decay = (G[..., :, None, :] - G[..., None, :, :]).exp()  # exp(G_i - G_j): [B, H, N, C, C, K]
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    L = (beta * torch.einsum("...ik,...jk,...ijk->...ij", k, k, decay)).masked_fill(lower.logical_not(), 0).tril(-1)
    Aqk = torch.einsum("...ik,...jk,...ijk->...ij", q, k, decay).masked_fill(lower.logical_not(), 0)
    eye = torch.eye(C, dtype=q.dtype)
    u = torch.linalg.solve_triangular(eye + L, beta * v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(eye + L, beta * k * G.exp(), upper=False, unitriangular=True)
    k_tilde = k * (G[..., -1:, :] - G).exp()  # decay from token j to the chunk end
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.double().clone()
    o = torch.empty_like(v)
    for n in range(q.shape[2]):
        o[:, :, n] = Aqk[:, :, n] @ u[:, :, n] + (q[:, :, n] * G[:, :, n].exp() - Aqk[:, :, n] @ w[:, :, n]) @ S
        M = torch.diag_embed(G[:, :, n, -1].exp()) - k_tilde[:, :, n].transpose(-1, -2) @ w[:, :, n]
        S = M @ S + k_tilde[:, :, n].transpose(-1, -2) @ u[:, :, n]
    o = o.flatten(2, 3)[:, :, :T].transpose(1, 2)
    return o, (S if output_final_state else None)
