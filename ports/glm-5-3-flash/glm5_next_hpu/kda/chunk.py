"""Chunked KDA prefill in plain PyTorch (all tensors rank <= 4).

Per chunk of C = 64 tokens, with G the inclusive cumulative log-decay inside the chunk
(G_i = g_1 + ... + g_i, per key channel, every g in (-5, 0)):

    L   = strict_lower( beta_i * sum_k k_ik k_jk exp(G_ik - G_jk) )      (C x C)
    Aqk = lower_incl_diag( sum_k q_ik k_jk exp(G_ik - G_jk) )           (C x C)
    u = (I + L)^-1 (beta v),   w = (I + L)^-1 (beta k * exp(G))
    o = Aqk u + (q * exp(G) - Aqk w) S_in
    S_out = M S_in + B,  M = diag(exp(G_C)) - k~^T w,  B = k~^T u,  k~ = k * exp(G_C - G)

``naive.naive_chunk_kda`` is these equations written out directly; this module computes
the same thing with a memory plan. Four numerical choices, each forced by real inputs:

* No all-pairs decay tensor. The reference materialises exp(G_i - G_j) for every
  (i, j, k) of every chunk at once (8.6 GB at 4K tokens x 64 heads). The cheap
  factorisation exp(G_i) * exp(-G_j) overflows fp32 instead: with the gate saturated at
  -5, G reaches about -300 inside a chunk and exp(300) is inf. Here the chunk is halved
  repeatedly (64 -> 32 -> ... -> 1); at each level the block of rows in a second half
  against the columns in its first half is anchored at the boundary a = G of the first
  half's last row: exp(G_i - a) and exp(a - G_j) both lie in (0, 1], so the block is an
  exact matmul of bounded factors. Only the diagonal (exp(0) = 1) is left over.
* Every exponent is floored at EXP_FLOOR before exp, so no factor and no product of two
  factors with the inputs is a subnormal float (see EXP_FLOOR).
* (I + L)^-1 by blocked forward substitution: the four 16 x 16 diagonal blocks by a
  triangular solve (forward substitution), then block rows in four dependent stages.
  Nilpotent doubling (I - L)(I + L^2)(I + L^4)... is exact in algebra but cancels
  catastrophically in fp32 when keys are correlated and beta is near 1 (rows 32-63 of
  every chunk come out wrong; ``test_nilpotent_doubling_inverse_fails_where_port_passes``).
* The carry between chunks (``scan.py``): the affine map S -> M S + B scanned in
  log2(N) levels (flat op count, what Gaudi's lazy mode needs), or the sequential loop
  over chunks (fewer flops: the faster path on CPU). ``use_scan`` chooses; by default the
  scan on HPU and the sequential loop elsewhere.

Layout: chunk-major, [N, R, C, X] flattened to [N*R, C, X] (R = batch * heads), so one
chunk of every head is a contiguous [R, C, X] slab for the carry.
"""

import torch
import torch.nn.functional as F

from .scan import default_use_scan, scan_states, sequential_chunk_scan
from .utils import l2norm_factor, mask_inputs, resolve_scale

BLOCK = 16
# Saturated gates drive exponents far below what fp32 resolves: exp(-300) next to O(1)
# terms is zero to fp32, but exp of -87 .. -104 is a subnormal, and so are products of
# small normal factors. Matmuls and elementwise ops on subnormals take a microcode path
# that is an order of magnitude slower on many CPUs (and the flush-to-zero mode is per
# thread). Flooring every exponent at -30 keeps every factor >= e^-30 ~ 9e-14, far below
# fp32 resolution of the sums it enters (2^-23 ~ 1.2e-7), so the float64 accuracy is
# unchanged, while the product of two floored factors with the O(1e-2) normalised q and k,
# e^-60 * 1e-4 ~ 1e-30, is still a normal float (>= 1.2e-38).
EXP_FLOOR = -30.0


def chunk_kda(
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
    use_scan: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA prefill, chunk by chunk, in fp32.

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
        mask: [B, T] bool, True = real token. A masked position gets q = k = v = 0, g = 0
            and beta = 0, which makes its step the identity.
        chunk_size: C, a power of two and a multiple of 16.
        use_scan: True: the Hillis-Steele carry (flat op count); False: the sequential
            carry (fewer flops); None: the scan when q is on HPU, the sequential carry
            elsewhere. Never read from the environment: callers pass their switches.

    Returns (o [B, T, H, V] in q's dtype, final fp32 state [B, H, K, V] or None).
    """
    if chunk_size % BLOCK or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two and a multiple of {BLOCK}, got {chunk_size}")
    dtype = q.dtype
    use_scan = default_use_scan(q.device) if use_scan is None else use_scan
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if mask is not None:
        q, k, v, g, beta = mask_inputs(mask, q, k, v, g, beta)
    Bsz, T, H, K = k.shape
    V = v.shape[-1]
    C = chunk_size
    N = (T + C - 1) // C
    R = Bsz * H
    NR = N * R
    beta = beta.unsqueeze(-1)
    if N * C != T:  # padded tail tokens are zeros (g = beta = 0: identity steps)
        q, k, v, g, beta = (F.pad(x, (0, 0, 0, 0, 0, N * C - T)) for x in (q, k, v, g, beta))

    def chunked(x):  # [B, T, H, X] -> [N, R, C, X], a view (a copy only when B > 1)
        return x.transpose(0, 1).reshape(N, C, R, x.shape[-1]).transpose(1, 2)

    beta_c = chunked(beta)
    q_scale = resolve_scale(scale, K)
    k_scale = 1.0
    if use_qk_l2norm_in_kernel:
        q_scale = chunked(l2norm_factor(q)).mul_(q_scale)
        k_scale = chunked(l2norm_factor(k))
    # Each input is read once: normalised, scaled and written chunk-major in one pass.
    # X holds beta k and q interleaved per row ([NR, C, 2, K]) so one matmul serves both.
    X = q.new_empty(NR, C, 2, K)
    # k, G and the weights W share one allocation, returned to the OS as a whole once W dies,
    # before the scan's peak (glibc keeps freed blocks under its 32 MB mmap ceiling resident
    # and often does not reuse them). Once k and G are dead their space is scratch.
    head = max(2 * C * K, 2 * BLOCK * (V + K))
    buf = q.new_empty(NR * (head + 2 * C * C))
    kc, G = buf[: 2 * NR * C * K].view(2, NR, C, K)
    W = buf[NR * head :].view(NR, C, 2, C)
    torch.mul(chunked(q), q_scale, out=X[:, :, 1].view(N, R, C, K))
    torch.mul(chunked(k), k_scale, out=kc.view(N, R, C, K))
    torch.mul(kc.view(N, R, C, K), beta_c, out=X[:, :, 0].view(N, R, C, K))
    torch.cumsum(chunked(g), dim=2, out=G.view(N, R, C, K))

    # The weights' temporaries, then the right-hand side of the solve: one allocation.
    work = q.new_empty(NR * C * max(2 * K, V + K))
    _lower_weights(X, kc, G, W, work)  # [NR, C, 2, C]: L (x = 0, strict lower read) and Aqk (x = 1)

    # u | w = (I + L)^-1 [beta v | beta k exp(G)], solved in place. exp(G) (decay from the
    # chunk start) goes straight into the w columns, where q and beta k pick it up.
    rhs = work[: NR * C * (V + K)].view(NR, C, V + K)
    gamma = rhs[..., V:]
    torch.clamp(G, min=EXP_FLOOR, out=gamma).exp_()
    q_gamma = X[:, :, 1].mul_(gamma)
    gamma.mul_(X[:, :, 0])
    torch.mul(chunked(v), beta_c, out=rhs[..., :V].view(N, R, C, V))
    # k~ = k exp(G_C - G) (decay to the chunk end) overwrites beta k, dead from here on.
    G_last = G[:, -1:].clone()
    decay = G_last.clamp_min(EXP_FLOOR).exp_().transpose(1, 2)  # [NR, K, 1]
    k_tilde = torch.mul(torch.sub(G_last, G, out=G).clamp_min_(EXP_FLOOR).exp_(), kc, out=X[:, :, 0])
    del gamma
    _forward_substitution(W, rhs, buf[: 2 * NR * BLOCK * (V + K)].view(2, NR, BLOCK, V + K))
    u, w = rhs[..., :V], rhs[..., V:]
    A_qk = W[:, :, 1]

    # o = Aqk u + (q exp(G) - Aqk w) S_in: the parts without S_in for every chunk at once
    # (chunk-major, so every matmul output is contiguous); q_eff overwrites q exp(G).
    q_eff = q_gamma.copy_(torch.baddbmm(q_gamma, A_qk, w, alpha=-1.0, out=kc))
    o_c = torch.bmm(A_qk, u)
    del W, A_qk, buf, kc, G, q_gamma

    S0 = q.new_zeros(R, K, V) if initial_state is None else initial_state.float().reshape(R, K, V)
    if use_scan:
        kt_t = k_tilde.transpose(1, 2)
        Mm = torch.bmm(kt_t, w).neg_()
        Mm.diagonal(dim1=1, dim2=2).add_(decay.view(NR, K))
        # states[0] = S0, then B = k~^T u; the scan turns it into the entering states in place.
        states = q.new_empty(N + 1, R, K, V)
        states[0] = S0
        torch.bmm(kt_t, u, out=states[1:].view(NR, K, V))
        del work, rhs, u, w, k_tilde, kt_t
        scan_states(Mm.view(N, R, K, K), states)
        del Mm
        o_c.baddbmm_(q_eff, states[:N].view(NR, K, V))
        S_final = states[N]
    else:
        S_final = sequential_chunk_scan(
            q_eff.view(N, R, C, K),
            k_tilde.view(N, R, C, K),
            u.view(N, R, C, V),
            w.view(N, R, C, K),
            decay.view(N, R, K, 1),
            S0,
            o_c.view(N, R, C, V),
        )
        del work, rhs, u, w, k_tilde
    del X, q_eff
    # Token-major, so the result is a view of it (o_c is chunk-major: contiguous matmul outputs).
    out = q.new_empty(N * C, R, V)
    out.view(N, C, R, V).transpose(1, 2).copy_(o_c.view(N, R, C, V))
    o = out.view(N * C, Bsz, H, V)[:T].transpose(0, 1).to(dtype)
    return o, (S_final.view(Bsz, H, K, V) if output_final_state else None)


def _lower_weights(X: torch.Tensor, k: torch.Tensor, G: torch.Tensor, W: torch.Tensor, scratch: torch.Tensor) -> None:
    """Writes W[m, i, x, j] = sum_c X[m, i, x, c] k[m, j, c] exp(G[m, i, c] - G[m, j, c]) for j <= i, else 0.

    X: [M, C, 2, K]; k, G: [M, C, K]. At block size 2s the rows of each second half
    against the columns of its first half are anchored at the first half's last row a:
    both exp(G_i - G_a) and exp(G_a - G_j) lie in (0, 1] (G is non-increasing), so the
    block is one exact batched matmul; halving down to s = 1 covers the strict lower
    triangle, and the diagonal needs no decay. W is written in (row, x) order, so a block's
    rows for both x are one contiguous matmul output.
    """
    M, C, _, K = X.shape
    W.zero_()
    # Every level's temporaries have the same total size: one scratch (>= 2 M C K elements)
    # for all of them (repeated fresh allocations of this size are not reused by glibc).
    scratch_d, scratch_l = scratch[: 2 * M * C * K].view(2, M * C * K)
    s = C // 2
    while s:
        nb = C // (2 * s)
        Gb = G.view(M * nb, 2 * s, K)
        # D = exp(G - a) in the second half, exp(a - G) in the first: every exponent <= 0.
        D = torch.sub(Gb, Gb[:, s - 1 : s], out=scratch_d.view(M * nb, 2 * s, K))
        right = D[:, :s].neg_()
        D.clamp_min_(EXP_FLOOR).exp_()
        right.mul_(k.view(M * nb, 2 * s, K)[:, :s])
        left = torch.mul(X.view(M * nb, 2 * s, 2, K)[:, s:], D[:, s:].unsqueeze(2), out=scratch_l.view(M * nb, s, 2, K))
        block = torch.bmm(left.view(M * nb, 2 * s, K), right.transpose(1, 2))
        # Rows s.. and columns ..s of every diagonal block of size 2s, both x at once.
        dst = W.as_strided((M, nb, 2 * s, s), (2 * C * C, 2 * s * (2 * C + 1), C, 1), W.storage_offset() + 2 * s * C)
        dst.copy_(block.view(M, nb, 2 * s, s))
        s //= 2
    diag = torch.bmm(X.view(M * C, 2, K), k.view(M * C, K, 1))
    W.as_strided((M, C, 2), (2 * C * C, 2 * C + 1, C), W.storage_offset()).copy_(diag.view(M, C, 2))


def _forward_substitution(W: torch.Tensor, rhs: torch.Tensor, scratch: torch.Tensor) -> None:
    """rhs <- (I + L)^-1 rhs in place, L = strict lower part of W[:, :, 0] ([M, C, 2, C]).

    The 16 x 16 diagonal blocks are inverted by one batched triangular solve (unit
    diagonal: W's own diagonal is never read), then block row p subtracts the solved rows
    above it. Only rows of earlier blocks are read, so the result overwrites rhs. scratch:
    [2, M, 16, rhs columns] (matmul outputs stay contiguous: a strided out falls back to
    one small matmul per batch entry).
    """
    M, C, _, _ = W.shape
    nb = C // BLOCK
    L = W[:, :, 0]
    diag = W.as_strided((M, nb, BLOCK, BLOCK), (2 * C * C, BLOCK * (2 * C + 1), 2 * C, 1), W.storage_offset())
    eye = torch.eye(BLOCK, dtype=W.dtype, device=W.device).expand(M, nb, BLOCK, BLOCK)
    T_diag = torch.linalg.solve_triangular(diag, eye, upper=False, unitriangular=True)
    r, y = scratch
    for p in range(nb):
        lo, hi = p * BLOCK, (p + 1) * BLOCK
        dst = rhs[:, lo:hi]
        if p:
            dst = torch.baddbmm(dst, L[:, lo:hi, :lo], rhs[:, :lo], alpha=-1.0, out=r)
        rhs[:, lo:hi] = torch.bmm(T_diag[:, p], dst, out=y)
