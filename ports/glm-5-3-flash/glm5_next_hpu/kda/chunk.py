"""Chunked KDA prefill in plain PyTorch (all tensors rank <= 4).

Per chunk of C = 64 tokens, with G the inclusive cumulative log-decay inside the chunk
(G_i = g_1 + ... + g_i, per key channel, every g in (-5, 0)):

    L   = strict_lower( beta_i * sum_k k_ik k_jk exp(G_ik - G_jk) )      (C x C)
    Aqk = lower_incl_diag( sum_k q_ik k_jk exp(G_ik - G_jk) )           (C x C)
    u = (I + L)^-1 (beta v),   w = (I + L)^-1 (beta k * exp(G))
    o = Aqk u + (q * exp(G) - Aqk w) S_in
    S_out = M S_in + B,  M = diag(exp(G_C)) - k~^T w,  B = k~^T u,  k~ = k * exp(G_C - G)

Three numerical choices, each forced by real inputs:

* No all-pairs decay tensor. The reference materialises exp(G_i - G_j) for every
  (i, j, k) of every chunk at once (8.6 GB at 4K tokens x 64 heads). The cheap
  factorisation exp(G_i) * exp(-G_j) overflows fp32 instead: with the gate saturated at
  -5, G reaches about -300 inside a chunk and exp(300) is inf. Here each 16-row block p
  is anchored at the block boundary a = G_{16p-1}: for i in block p and j before it,
  exp(G_i - a) and exp(a - G_j) both lie in (0, 1], so the off-diagonal blocks are an
  exact matmul of bounded factors. Only the 16 x 16 diagonal blocks need exp(G_i - G_j)
  elementwise; they are built one column at a time, so the largest temporary is the
  size of k.
* (I + L)^-1 by blocked forward substitution: the four 16 x 16 diagonal blocks by a
  triangular solve (forward substitution), then block rows in four dependent stages.
  Nilpotent doubling (I - L)(I + L^2)(I + L^4)... is exact in algebra but cancels
  catastrophically in fp32 when keys are correlated and beta is near 1 (seed 001:
  rows 32-63 of every chunk wrong on real inputs).
* The carry between chunks is the affine map S -> M S + B, scanned in log2(N) levels
  (``scan.py``); the sequential loop is kept as the reference path.
"""

import torch
import torch.nn.functional as F

from .recurrent import _mask_inputs
from .gate import l2norm
from .scan import affine_scan, scan_enabled, sequential_affine_scan

BLOCK = 16


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
    use_qk_l2norm_in_kernel: bool = True,
    mask: torch.Tensor | None = None,
    chunk_size: int = 64,
    use_scan: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k, g: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; initial_state [B, H, K, V].

    ``mask`` [B, T] (True = real token) removes padding from the recurrence: a masked
    position gets q = k = v = 0, g = 0 and beta = 0, which makes its step the identity.
    ``use_scan`` None reads GLM5_NEXT_KDA_SCAN (default on). Computes in fp32; returns
    (o [B, T, H, V] in q's dtype, final fp32 state [B, H, K, V] or None).
    """
    if chunk_size % BLOCK:
        raise ValueError(f"chunk_size must be a multiple of {BLOCK}, got {chunk_size}")
    dtype = q.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if mask is not None:
        q, k, v, g, beta = _mask_inputs(mask, q, k, v, g, beta)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    Bsz, T, H, K = k.shape
    V = v.shape[-1]
    C = chunk_size
    N = (T + C - 1) // C
    R = Bsz * H
    q = q * K**-0.5

    # Head-major chunks: [R*N, C, X]. Padded tail tokens are zeros (g = beta = 0: identity steps).
    def chunks(x):
        x = x.transpose(1, 2)
        x = F.pad(x, (0, 0, 0, N * C - T))
        return x.reshape(R * N, C, x.shape[-1])

    qkg = chunks(torch.cat([q, k, g], dim=-1))
    q, k, g = qkg[..., :K], qkg[..., K : 2 * K], qkg[..., 2 * K :]
    v = chunks(v)
    beta = chunks(beta.unsqueeze(-1))
    del qkg

    G = g.cumsum(dim=1)
    kb = k * beta
    gamma = G.exp()  # decay from chunk start, in (0, 1]
    G_last = G[:, -1:, :]

    # Intra-chunk weights, lower triangle incl. diagonal: [RN, C, C] each.
    L, A_qk = _lower_weights([kb, q], k, G)
    L = L.tril(-1)

    # u | w = (I + L)^-1 [beta v | beta k exp(G)] by blocked forward substitution.
    rhs = torch.cat([v * beta, kb * gamma], dim=-1)
    nb = C // BLOCK
    eye = torch.eye(BLOCK, dtype=torch.float32, device=q.device)
    # Inverses of the unit-lower 16 x 16 diagonal blocks: one batched forward substitution.
    L_blocks = L.view(R * N, nb, BLOCK, nb * BLOCK)
    L_diag = torch.stack([L_blocks[:, p, :, p * BLOCK : (p + 1) * BLOCK] for p in range(nb)], dim=1)
    T_diag = torch.linalg.solve_triangular(L_diag + eye, eye.expand_as(L_diag), upper=False, unitriangular=True)
    Y = T_diag[:, 0] @ rhs[:, :BLOCK]
    for p in range(1, nb):
        lo, hi = p * BLOCK, (p + 1) * BLOCK
        r = rhs[:, lo:hi] - L[:, lo:hi, :lo] @ Y
        Y = torch.cat([Y, T_diag[:, p] @ r], dim=1)
    del rhs, T_diag, L, L_blocks, L_diag
    u, w = Y[..., :V], Y[..., V:]

    # Chunk transition S_out = M S_in + B (every exponent <= 0).
    k_tilde_t = (k * (G_last - G).exp()).transpose(1, 2)  # [RN, K, C]
    M = torch.baddbmm(torch.diag_embed(G_last.squeeze(1).exp()), k_tilde_t, w, alpha=-1.0)
    Bmat = torch.bmm(k_tilde_t, u)
    del k_tilde_t

    S0 = (
        q.new_zeros(R, K, V)
        if initial_state is None
        else initial_state.float().reshape(R, K, V)
    )
    M = M.view(R, N, K, K).transpose(0, 1).contiguous()
    Bmat = Bmat.view(R, N, K, V).transpose(0, 1).contiguous()
    scan = affine_scan if (scan_enabled() if use_scan is None else use_scan) else sequential_affine_scan
    S_in, S_final = scan(M, Bmat, S0)
    del M, Bmat
    S_in = S_in.transpose(0, 1).reshape(R * N, K, V)

    # o = Aqk u + (q exp(G) - Aqk w) S_in
    q_eff = torch.baddbmm(q * gamma, A_qk, w, alpha=-1.0)
    o = torch.baddbmm(torch.bmm(A_qk, u), q_eff, S_in)
    o = o.view(Bsz, H, N * C, V)[:, :, :T].transpose(1, 2).to(dtype)
    return o, (S_final.view(Bsz, H, K, V) if output_final_state else None)


LEAF = 4


def _lower_weights(xs: list[torch.Tensor], k: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    """P_x[i, j] = sum_c x_ic k_jc exp(G_ic - G_jc) for j <= i, else 0, for each x in xs.

    xs, k, G: [M, n, K] -> list of [M, n, n]. Rows are split into 4 blocks of n/4. Block
    p is anchored at the boundary a = G_{p n/4 - 1}: for its rows i and all earlier
    columns j, exp(G_i - a) and exp(a - G_j) both lie in (0, 1], so the off-diagonal
    part is an exact matmul of bounded factors (the naive exp(G_i) exp(-G_j) overflows:
    G reaches about -300 in a 64-token chunk). Diagonal blocks recurse (64 -> 16 -> 4);
    at 4 x 4 the decay is taken elementwise one column at a time, so no temporary is
    larger than k.
    """
    M, n, K = k.shape
    if n <= LEAF:
        cols = [[] for _ in xs]
        for j in range(n):
            # Rows i < j would get a positive exponent: clamp to 0 (no overflow), masked below.
            kj = k[:, j : j + 1] * (G - G[:, j : j + 1]).clamp_max(0.0).exp()
            for c, x in zip(cols, xs):
                c.append((x * kj).sum(-1))
        keep = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()
        return [torch.stack(c, dim=-1).masked_fill(~keep, 0.0) for c in cols]
    s = n // 4
    diag = _lower_weights([x.reshape(-1, s, K) for x in xs], k.reshape(-1, s, K), G.reshape(-1, s, K))
    diag = [d.view(M, 4, s, s) for d in diag]
    rows = [[] for _ in xs]
    for p in range(4):
        lo, hi = p * s, (p + 1) * s
        if p:
            anchor = G[:, lo - 1 : lo]
            left_decay = (G[:, lo:hi] - anchor).exp()
            right = (k[:, :lo] * (anchor - G[:, :lo]).exp()).transpose(1, 2)
        for r, x, d in zip(rows, xs, diag):
            parts = [torch.bmm(x[:, lo:hi] * left_decay, right)] if p else []
            parts.append(d[:, p])
            if p < 3:
                parts.append(k.new_zeros(M, s, n - hi))
            r.append(torch.cat(parts, dim=-1))
    return [torch.cat(r, dim=1) for r in rows]
