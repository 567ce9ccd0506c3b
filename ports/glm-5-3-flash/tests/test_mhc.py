"""mHC against transformers' HyperConnection and a float64 recomputation."""

import torch
from transformers.models.glm5_next import modeling_glm5_next as ref

from glm5_next_hpu.mhc import hc_head, hc_post, hc_pre, sinkhorn, sinkhorn_tpc_order
from packtests.flash_reference import max_abs


class _Cfg:
    hc_mult, hc_sinkhorn_iters, hc_eps, rms_norm_eps, hidden_size = 4, 20, 1e-6, 1e-5, 32


def _reference_hc(seed=0):
    torch.manual_seed(seed)
    hc = ref.Glm5NextTextHyperConnection(_Cfg())
    with torch.no_grad():
        hc.fn.normal_(0, 0.5)  # strong logits: far from uniform comb
        hc.base.normal_(0, 1.0)  # nonzero base
        hc.scale.copy_(torch.tensor([0.7, 1.3, 2.0]))
    return hc


def test_hc_pre_matches_transformers_hyperconnection():
    hc = _reference_hc()
    X = torch.randn(2, 7, 4, 32)
    with torch.no_grad():
        post_r, comb_r, x_r = hc(X)
    post, comb, x = hc_pre(X, hc.fn, hc.base, hc.scale, 1e-5, 1e-6, 20)
    assert max_abs(post, post_r) < 1e-6
    assert max_abs(comb, comb_r) < 1e-6
    assert max_abs(x, x_r) < 1e-5


def test_hc_pre_matches_float64_recomputation():
    hc = _reference_hc(1)
    X = torch.randn(2, 5, 4, 32)
    post, comb, _ = hc_pre(X, hc.fn, hc.base, hc.scale, 1e-5, 1e-6, 20)
    post64, comb64, _ = hc_pre(X.double(), hc.fn.double(), hc.base.double(), hc.scale.double(), 1e-5, 1e-6, 20)
    assert max_abs(post, post64) < 5e-6 and max_abs(comb, comb64) < 5e-6


def test_sinkhorn_ends_on_a_column_step_columns_sum_to_one():
    torch.manual_seed(0)
    comb = torch.softmax(3 * torch.randn(10, 4, 4), -1) + 1e-6
    out = sinkhorn(comb, 20, 1e-6)
    assert float((out.sum(-2) - 1).abs().max()) < 1e-5
    assert float((out.sum(-1) - 1).abs().max()) > 1e-4  # rows only approximately: 39 steps, not converged


def test_tpc_order_sinkhorn_agrees_with_reference_loop_to_rounding():
    torch.manual_seed(0)
    comb = torch.softmax(3 * torch.randn(64, 4, 4), -1) + 1e-6
    a = sinkhorn_tpc_order(comb, 20, 1e-6)
    b = sinkhorn(comb, 20, 1e-6)
    c = sinkhorn(comb.double(), 20, 1e-6)
    assert max_abs(a, c) < 2e-6 and max_abs(b, c) < 2e-6


def test_tpc_order_sinkhorn_is_pinned_to_its_documented_op_order():
    # Recompute one matrix in plain Python float32 arithmetic in the documented order;
    # the torch version must agree bit for bit.
    import numpy as np

    torch.manual_seed(1)
    comb = torch.softmax(2 * torch.randn(4, 4), -1) + 1e-6
    c = comb.numpy().astype(np.float32).copy()
    f = np.float32
    eps = f(1e-6)

    def col(c):
        r = [f(1) / (((c[0, j] + c[1, j]) + c[2, j]) + c[3, j] + eps) for j in range(4)]
        return np.array([[c[i, j] * r[j] for j in range(4)] for i in range(4)], dtype=np.float32)

    def row(c):
        r = [f(1) / ((c[i, 0] + c[i, 1]) + (c[i, 2] + c[i, 3]) + eps) for i in range(4)]
        return np.array([[c[i, j] * r[i] for j in range(4)] for i in range(4)], dtype=np.float32)

    c = col(c)
    for _ in range(19):
        c = col(row(c))
    assert torch.equal(sinkhorn_tpc_order(comb, 20, 1e-6), torch.from_numpy(c))


def test_hc_post_is_post_times_y_plus_comb_transposed_mix():
    torch.manual_seed(0)
    X, y = torch.randn(1, 3, 4, 8), torch.randn(1, 3, 8)
    post, comb = torch.rand(1, 3, 4), torch.rand(1, 3, 4, 4)
    out = hc_post(y, X, post, comb)
    j = 2
    expected = post[..., j, None] * y + sum(comb[..., i, j, None] * X[..., i, :] for i in range(4))
    assert max_abs(out[..., j, :], expected) < 1e-6


def test_final_head_is_the_unweighted_stream_mean():
    X = torch.randn(2, 3, 4, 8)
    assert max_abs(hc_head(X), ref.Glm5NextTextHyperHead()(X)) == 0.0
    assert max_abs(hc_head(X), X.sum(2) / 4) < 1e-6
