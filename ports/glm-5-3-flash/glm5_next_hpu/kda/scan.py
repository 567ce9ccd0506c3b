"""The carry between KDA chunks: S[n+1] = M[n] S[n] + B[n].

Chunk n maps its entering state affinely, with M[n] = diag(exp(G_last)) - k~^T w and
B[n] = k~^T u (see ``chunk.py``). The states entering all chunks are therefore an
inclusive scan of affine maps, which Hillis-Steele evaluates in ceil(log2(N)) levels of
batched matmuls instead of N dependent steps; that is what keeps the per-prompt op
count (and host graph-recording time on Gaudi lazy mode) flat in the sequence length.

Every M[n] is a product of contractions (decay <= 1, and I - beta k k^T with
0 < beta < 1 and unit keys), so composing them in any order has no cancellation problem.

The price is flops: about log2(N) batched K x K products per chunk. The sequential
carry (``sequential_chunk_scan``) steps through the chunks in delta form with a few
C x K products each and never forms M: N times more ops, several times fewer flops, so
it is the faster path on CPU. ``sequential_affine_scan`` is the affine form's
step-by-step reference for the tests.
"""

import torch


def default_use_scan(device: torch.device) -> bool:
    """The carry ``chunk_kda`` uses when its caller does not choose: the scan on HPU, where
    lazy mode records every op of a prompt into a graph and the scan's op count stays flat
    in the sequence length; the sequential carry elsewhere, where flops are the cost."""
    return torch.device(device).type == "hpu"


def affine_scan(M: torch.Tensor, B: torch.Tensor, S0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hillis-Steele scan. M: [N, R, K, K]; B: [N, R, K, V]; S0: [R, K, V] (R = batch*heads).

    Returns (states entering each chunk [N, R, K, V], final state [R, K, V]); the inputs
    are not modified.
    """
    N, R, K, V = B.shape
    states = B.new_empty(N + 1, R, K, V)
    states[0] = S0
    states[1:] = B
    scan_states(M.clone(memory_format=torch.contiguous_format), states)
    return states[:-1], states[-1]


def scan_states(M: torch.Tensor, states: torch.Tensor) -> None:
    """In place: states [N + 1, R, K, V] holds S0 then B; afterwards states[n] is the state
    entering chunk n and states[N] the final one. M [N, R, K, K] is used as scratch.

    Chunk-major layout, so each level's shifted operands are contiguous slices along
    dim 0 and the whole level is one bmm and one add (plus one bmm for the M products).
    """
    N, R, K, V = M.shape[0], M.shape[1], M.shape[2], states.shape[-1]
    Ms = M.view(N * R, K, K)
    # Fold the initial state into the first chunk: afterwards prefix n of Bs *is* S[n+1].
    Bs = states.view((N + 1) * R, K, V)[R:]
    Bs[:R].baddbmm_(Ms[:R], states[0])
    # One buffer for every level's products (fresh allocations of this size are not
    # reused by glibc and would add to the peak RSS at each level).
    scratch = M.new_empty(max(N - 1, 1) * R * K * max(K, V))
    shift = 1
    while shift < N:
        a = shift * R
        n = (N - shift) * R
        Bs[a:].add_(torch.bmm(Ms[a:], Bs[:-a], out=scratch[: n * K * V].view(n, K, V)))
        # M products are needed only where they are left factors of the next level.
        if 2 * shift < N:
            n -= a
            dst = Ms[2 * a :]
            dst.copy_(torch.bmm(dst, Ms[a:-a], out=scratch[: n * K * K].view(n, K, K)))
        shift *= 2


def sequential_affine_scan(M: torch.Tensor, B: torch.Tensor, S0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference for :func:`affine_scan`: N dependent steps, same contract."""
    states = []
    S = S0
    for n in range(B.shape[0]):
        states.append(S)
        S = torch.baddbmm(B[n], M[n], S)
    return torch.stack(states, dim=0), S


def sequential_chunk_scan(
    q_eff: torch.Tensor,
    k_tilde: torch.Tensor,
    u: torch.Tensor,
    w: torch.Tensor,
    decay: torch.Tensor,
    S0: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """The sequential carry, one chunk of every head per step, in delta form.

    q_eff, k_tilde, w: [N, R, C, K]; u: [N, R, C, V]; decay (exp(G_C)): [N, R, K, 1];
    S0: [R, K, V]; out [N, R, C, V] (contiguous) holds Aqk u and gets q_eff S added. Per
    chunk v' = u - w S and S <- decay * S + k~^T v': the same map as M S + B without
    forming M (K x K per chunk) or keeping every entering state, so it does about half
    the flops of the affine form and holds one state. Returns the final state.
    """
    S = S0.clone()  # updated in place below
    for n in range(u.shape[0]):
        out[n].baddbmm_(q_eff[n], S)
        v_new = torch.baddbmm(u[n], w[n], S, alpha=-1.0)
        S.mul_(decay[n]).baddbmm_(k_tilde[n].transpose(1, 2), v_new)
    return S
