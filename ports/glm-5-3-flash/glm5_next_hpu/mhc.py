"""Manifold hyper-connections (mHC): 4 residual streams mixed through a Sinkhorn projection.

Per block (attention or FFN), from the N streams X [B, S, N, D]:
  flat = rms(X flattened to N*D)  (unweighted, eps = rms_norm_eps), all in fp32
  pre_w | post_w | comb_w = flat @ fn^T  (N, N, N*N)
  pre  = sigmoid(s0 pre_w + pre_b) + hc_eps          -> collapses the streams into the block input
  post = 2 sigmoid(s1 post_w + post_b)               -> expands the block output back to N streams
  comb = sinkhorn(softmax(s2 comb_w + comb_b) + hc_eps)
  out_j = post_j * y + sum_i comb[i, j] X_i          (post/comb cast to the stream dtype first)
After the last layer the streams are averaged (unweighted; not DeepSeek-V4's weighted head).
"""

import torch
import torch.nn.functional as F


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The reference loop: one column normalisation, then iters-1 (row, column) pairs.

    39 normalisations for iters = 20; the last one is a column step, so columns sum to 1
    and rows only approximately.
    """
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def sinkhorn_tpc_order(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn for 4 x 4 in the exact operation order of the fused TPC kernel.

    Written element by element so every rounding is pinned down and the result can be
    compared bit for bit with the kernel on a card (the loop above leaves the summation
    order to torch.sum):

    * row sums (over the last axis, j): pairwise tree, (c[i,0] + c[i,1]) + (c[i,2] + c[i,3]);
    * column sums (over axis -2, i): sequential, ((c[0,j] + c[1,j]) + c[2,j]) + c[3,j];
    * the eps is added to the finished sum, then r = reciprocal(sum + eps) once per
      row/column and every element is scaled as x * r (not x / y: the TPC has no
      divide; this differs from the reference loop by up to an ulp per step);
    * step order as the reference: column, then iters-1 times (row, column).

    fp32 in, fp32 out; comb [..., 4, 4].
    """
    if comb.shape[-2:] != (4, 4):
        raise ValueError(f"the TPC Sinkhorn order is defined for 4 x 4, got {tuple(comb.shape[-2:])}")
    c = [[comb[..., i, j] for j in range(4)] for i in range(4)]

    def col_step(c):
        r = [torch.reciprocal(((c[0][j] + c[1][j]) + c[2][j]) + c[3][j] + eps) for j in range(4)]
        return [[c[i][j] * r[j] for j in range(4)] for i in range(4)]

    def row_step(c):
        r = [torch.reciprocal((c[i][0] + c[i][1]) + (c[i][2] + c[i][3]) + eps) for i in range(4)]
        return [[c[i][j] * r[i] for j in range(4)] for i in range(4)]

    c = col_step(c)
    for _ in range(iters - 1):
        c = col_step(row_step(c))
    return torch.stack([torch.stack(row, dim=-1) for row in c], dim=-2)


def hc_pre(
    X: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    rms_eps: float,
    hc_eps: float,
    iters: int,
    tpc_order: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """X [B, S, N, D] -> (post [B, S, N] fp32, comb [B, S, N, N] fp32, block input [B, S, D] in X's dtype).

    ``tpc_order`` (GLM5_NEXT_MHC_SINKHORN=kernel) calls the op ``hpu_glm::mhc_sinkhorn``
    (``sinkhorn_op``); otherwise the reference loop."""
    Bsz, S, N, D = X.shape
    flat = X.reshape(Bsz, S, N * D).float()
    # RMS scale applied before the projection, as the reference does (vLLM applies it after; same algebra, other rounding).
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_eps)
    mix = F.linear(flat, fn.float())
    pre_w, post_w, comb_w = mix.split([N, N, N * N], dim=-1)
    pre_b, post_b, comb_b = base.float().split([N, N, N * N])
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    comb = torch.softmax(comb_w.unflatten(-1, (N, N)) * scale[2] + comb_b.view(N, N), dim=-1) + hc_eps
    if tpc_order:  # GLM5_NEXT_MHC_SINKHORN=kernel: the op (the TPC kernel, or its order emulated)
        from .sinkhorn_op import mhc_sinkhorn

        comb = mhc_sinkhorn(comb, iters, hc_eps)
    else:
        comb = sinkhorn(comb, iters, hc_eps)
    collapsed = (pre.unsqueeze(-1) * X).sum(dim=2).to(X.dtype)
    return post, comb, collapsed


def hc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """out_j = post_j y + sum_i comb[i, j] residual_i, in the stream dtype (as the reference)."""
    dtype = residual.dtype
    return post.to(dtype).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), residual)


def hc_head(X: torch.Tensor) -> torch.Tensor:
    """Final collapse of the streams: the unweighted mean."""
    return X.mean(dim=2)
