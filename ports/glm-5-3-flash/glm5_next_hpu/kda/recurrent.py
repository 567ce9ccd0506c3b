"""KDA decode: one (or a few) tokens against an fp32 state."""

import torch

from .gate import l2norm


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = True,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, g: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; mask: [B, T] bool (True = real token).

    The state stays fp32 whatever the activation dtype: it accumulates over the whole
    context and bf16 would drift. A masked position leaves the state untouched (g=0,
    beta=0 makes the step the identity). Returns (o in q's dtype, fp32 state).
    """
    dtype = q.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if mask is not None:
        q, k, v, g, beta = _mask_inputs(mask, q, k, v, g, beta)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    B, T, H, K = k.shape
    q = q * K**-0.5
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
    return torch.stack(outs, dim=1).to(dtype), S


def _mask_inputs(mask, q, k, v, g, beta):
    # torch.where, not a multiply: 0 * NaN is NaN, and a NaN in one padded slot would
    # otherwise poison the state of every later token.
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
