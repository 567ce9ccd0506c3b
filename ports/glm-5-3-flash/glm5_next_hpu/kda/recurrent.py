"""KDA decode: one (or a few) tokens against an fp32 state."""

import torch

from .utils import l2norm, mask_inputs, resolve_scale


def fused_recurrent_kda(
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
    """The KDA recurrence step by step, state in fp32 whatever the activation dtype.

    The state accumulates over the whole context and bf16 would drift, hence fp32.

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
        mask: [B, T] bool, True = real token; a padded position leaves the state untouched.

    Returns (o [B, T, H, V] in q's dtype, final fp32 state [B, H, K, V] or None).
    """
    dtype = q.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if mask is not None:
        q, k, v, g, beta = mask_inputs(mask, q, k, v, g, beta)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    B, T, H, K = k.shape
    q = q * resolve_scale(scale, K)
    S = (
        torch.zeros(B, H, K, v.shape[-1], dtype=torch.float32, device=q.device)
        if initial_state is None
        else initial_state.float()
    )
    outs = []
    for t in range(T):
        S = S * g[:, t].exp().unsqueeze(-1)
        kv_mem = torch.matmul(k[:, t].unsqueeze(-2), S).squeeze(-2)  # S^T k
        delta = (v[:, t] - kv_mem) * beta[:, t].unsqueeze(-1)
        S = S + k[:, t].unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append(torch.matmul(q[:, t].unsqueeze(-2), S).squeeze(-2))
    return torch.stack(outs, dim=1).to(dtype), (S if output_final_state else None)
