"""The carry between KDA chunks: S[n+1] = M[n] S[n] + B[n].

Chunk n maps its entering state affinely, with M[n] = diag(exp(G_last)) - k~^T w and
B[n] = k~^T u (see ``chunk.py``). The states entering all chunks are therefore an
inclusive scan of affine maps, which Hillis-Steele evaluates in ceil(log2(N)) levels of
batched matmuls instead of N dependent steps; that is what keeps the per-prompt op
count (and host graph-recording time on Gaudi lazy mode) flat in the sequence length.

Every M[n] is a product of contractions (decay <= 1, and I - beta k k^T with
0 < beta < 1 and unit keys), so composing them in any order has no cancellation problem.
"""

import os

import torch


def scan_enabled() -> bool:
    """GLM5_NEXT_KDA_SCAN=1 (default) selects the Hillis-Steele scan, 0 the sequential loop."""
    return os.environ.get("GLM5_NEXT_KDA_SCAN", "1") != "0"


def affine_scan(M: torch.Tensor, B: torch.Tensor, S0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hillis-Steele scan. M: [N, R, K, K]; B: [N, R, K, V]; S0: [R, K, V] (R = batch*heads).

    Chunk-major layout, so each level's shifted operands are contiguous slices along
    dim 0 and the whole level is one baddbmm (plus one bmm for the M products).
    Returns (states entering each chunk [N, R, K, V], final state [R, K, V]).
    """
    N, R, K, V = B.shape
    # Fold the initial state into the first chunk: afterwards prefix n of B *is* S[n+1].
    Bs = B.reshape(N * R, K, V).clone()
    Bs[:R] = torch.baddbmm(Bs[:R], M[0], S0)
    # Written in place below, so never alias the caller's M.
    Ms = M.reshape(N * R, K, K).clone() if N > 2 else M.reshape(N * R, K, K)
    shift = 1
    while shift < N:
        a = shift * R
        Bs[a:] = torch.baddbmm(Bs[a:], Ms[a:], Bs[:-a])
        # M products are needed only where they are left factors of the next level.
        if 2 * shift < N:
            Ms[2 * a :] = torch.bmm(Ms[2 * a :], Ms[a:-a])
        shift *= 2
    after = Bs.view(N, R, K, V)
    entering = torch.cat([S0.unsqueeze(0), after[:-1]], dim=0)
    return entering, after[-1]


def sequential_affine_scan(M: torch.Tensor, B: torch.Tensor, S0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference path: N dependent steps. Same contract as :func:`affine_scan`."""
    states = []
    S = S0
    for n in range(B.shape[0]):
        states.append(S)
        S = torch.baddbmm(B[n], M[n], S)
    return torch.stack(states, dim=0), S
