"""mixture_of_experts overloads vs an explicit per-token, per-slot loop.

The reference walks every (token, top-k slot), looks the expert up, and applies the MLP with
float32 weights dequantised by explicit formulas (FP8: value * scale, expanded block by block
with Python loops; MXFP4: the project's own numpy reference ports/glm-5-mxfp4/glm5_mxfp4).
Tolerances: see packtests/kernel_checks.py TOL.
"""

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpu_emulation import ops
from hpu_emulation.config import card
from hpu_emulation.kernels import moe as M
from packtests.kernel_checks import REPO_PATHS, assert_close, close

ops.register()
DTYPES = [torch.float32, torch.bfloat16]
T, H, I, E, TOPK = 7, 16, 8, 4, 2  # noqa: E741  (I: the MoE intermediate size)


def routing(n_experts=E, seed=0, t=T):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(n_experts, generator=g)[:TOPK] for _ in range(t)])
    w = torch.rand(t, TOPK, generator=g)
    return ids, w / w.sum(-1, keepdim=True)


def weights(n=E, seed=1, dtype=torch.float32, inter=I):
    g = torch.Generator().manual_seed(seed)
    w12 = [(torch.randn(2 * inter, H, generator=g) / 4).to(dtype) for _ in range(n)]
    w3 = [(torch.randn(H, inter, generator=g) / 4).to(dtype) for _ in range(n)]
    return w12, w3


def act_ref(name):
    return {
        "silu": lambda g, u: g * torch.sigmoid(g) * u,
        "gelu": lambda g, u: 0.5 * g * (1 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g**3))) * u,
        "relu": lambda g, u: torch.clamp(g, min=0) * u,
    }[name]


def swiglu_oai_ref(h, alpha=1.702, limit=7.0):
    g, u = h[0::2], h[1::2]
    g = torch.clamp(g, max=limit)
    u = torch.clamp(u, -limit, limit)
    return (u + 1) * g / (1 + torch.exp(-alpha * g))


def moe_ref(x, ids, rw, w12, w3, act="silu", lo=0, hi=None, b12=None, b3=None, gated=None, inter_q=None):
    """Explicit loop; w12/w3 float32 [out, in]; ids outside [lo, hi] contribute nothing."""
    hi = lo + len(w12) - 1 if hi is None else hi
    out = torch.zeros(x.shape[0], w3[0].shape[0])
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            if not lo <= e <= hi:
                continue
            j = e - lo
            h = w12[j].float() @ x[t].float()
            if b12 is not None:
                h = h + b12[j].float()
            if gated is None:
                half = h.shape[0] // 2
                a = act_ref(act)(h[:half], h[half:])
            else:
                a = gated(h)
            if inter_q is not None:
                a = inter_q(j, a)
            y = w3[j].float() @ a
            if b3 is not None:
                y = y + b3[j].float()
            out[t] += float(rw[t, s]) * y
    return out


def moe(**kw):
    return torch.ops.hpu.mixture_of_experts(**kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu", "relu"])
def test_fused_weights_activations(dtype, act):
    x = torch.randn(T, H).to(dtype)
    ids, rw = routing()
    w12, w3 = weights(dtype=dtype)
    got = moe(
        hidden_states=x,
        expert_routing_table=ids,
        router_weights=rw.to(dtype),
        w12=w12,
        w3=w3,
        permuted_weights=True,
        activation=act,
        experts_min=0,
        experts_max=E - 1,
    )
    assert got.dtype == dtype
    assert_close(got, moe_ref(x, ids, rw.to(dtype), w12, w3, act), dtype)


def test_default_overload_separate_w1_w2_w3_equals_fused():
    x = torch.randn(T, H)
    ids, rw = routing()
    w12, w3 = weights()
    w1 = [w[:I] for w in w12]
    w2 = [w[I:] for w in w12]
    got = moe(
        hidden_states=x,
        expert_routing_table=ids,
        router_weights=rw,
        w1=w1,
        w2=w2,
        w3=w3,
        permuted_weights=True,
        activation="silu",
        experts_min=0,
        experts_max=E - 1,
    )
    assert_close(got, moe_ref(x, ids, rw, w12, w3))
    # permuted_weights=False: [in, out] weights, same result
    got_t = moe(
        hidden_states=x,
        expert_routing_table=ids,
        router_weights=rw,
        w1=[w.t() for w in w1],
        w2=[w.t() for w in w2],
        w3=[w.t() for w in w3],
        permuted_weights=False,
        activation="silu",
        experts_min=0,
        experts_max=E - 1,
    )
    assert_close(got_t, got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_expert_parallel_and_slices_sum_to_whole(dtype):
    """Two cards with 4 experts each (experts_min 0 / 4), and 2 slices per card, sum to the 8-expert MoE."""
    n = 8
    x = torch.randn(T, H).to(dtype)
    ids, rw = routing(n)
    w12, w3 = weights(n, dtype=dtype)
    full = moe(
        hidden_states=x,
        expert_routing_table=ids,
        router_weights=rw,
        w12=w12,
        w3=w3,
        permuted_weights=True,
        activation="silu",
        experts_min=0,
        experts_max=n - 1,
    )
    assert_close(full, moe_ref(x, ids, rw, w12, w3), dtype)
    parts = []
    for lo in range(0, n, 2):  # slices of 2 experts, as VllmMixtureOfExpertsOp's MAX_EXPERTS_PER_SLICE loop
        parts.append(
            moe(
                hidden_states=x,
                expert_routing_table=ids,
                router_weights=rw,
                w12=w12[lo : lo + 2],
                w3=w3[lo : lo + 2],
                permuted_weights=True,
                activation="silu",
                experts_min=lo,
                experts_max=lo + 1,
            ).float()
        )
        assert_close(parts[-1], moe_ref(x, ids, rw, w12[lo : lo + 2], w3[lo : lo + 2], lo=lo), dtype)
    assert_close(sum(parts), full, dtype)
    # a card holding experts 4..7 only: tokens routed elsewhere get 0
    card1 = moe(
        hidden_states=x,
        expert_routing_table=ids,
        router_weights=rw,
        w12=w12[4:],
        w3=w3[4:],
        permuted_weights=True,
        activation="silu",
        experts_min=4,
        experts_max=7,
    )
    no_local = ~((ids >= 4).any(-1))
    assert torch.all(card1[no_local] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_fused_weights_gpt_oss_swiglu(dtype):
    x = (torch.randn(T, H) * 2).to(dtype)
    ids, rw = routing()
    w12, w3 = weights(dtype=dtype)
    w12 = [w * 8 for w in w12]  # push some gates past the clamp limit
    g = torch.Generator().manual_seed(5)
    b12 = [torch.randn(2 * I, generator=g).to(dtype) for _ in range(E)]
    b3 = [torch.randn(H, generator=g).to(dtype) for _ in range(E)]
    got = torch.ops.hpu.mixture_of_experts.bias_fused_weights(
        hidden_states=x,
        expert_routing_table=ids,
        router_weights=rw.to(dtype),
        w12=w12,
        w3=w3,
        w12_bias=b12,
        w3_bias=b3,
        permuted_weights=True,
        experts_min=0,
        experts_max=E - 1,
    )
    ref = moe_ref(x, ids, rw.to(dtype), w12, w3, b12=b12, b3=b3, gated=swiglu_oai_ref)
    assert_close(got, ref, dtype, atol=5e-2 if dtype == torch.bfloat16 else 1e-4)


def quant_fp8(w, layout, fp8, block=(4, 8)):
    """Explicit FP8 weight quantisation; returns (fp8 weight, scale, float32 dequantised reference)."""
    lim = torch.finfo(fp8).max if not (fp8 == torch.float8_e4m3fn and card().name == "gaudi2") else 240.0
    if layout == "tensor":
        s = w.abs().amax() / lim
        q = (w / s).to(fp8)
        return q, s, q.float() * s
    if layout == "channel":
        s = w.abs().amax(1) / lim
        q = (w / s[:, None]).to(fp8)
        return q, s, q.float() * s[:, None]
    b0, b1 = block
    rows, cols = w.shape
    sr, sc = -(-rows // b0), -(-cols // b1)
    s = torch.empty(sr, sc)
    deq = torch.empty(rows, cols)
    q = torch.empty(rows, cols, dtype=fp8)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1]
            s[i, j] = blk.abs().amax() / lim
            qb = (blk / s[i, j]).to(fp8)
            q[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = qb
            deq[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = qb.float() * s[i, j]
    return q, s, deq


@pytest.mark.parametrize("layout", ["tensor", "channel", "block"])
@pytest.mark.parametrize("per_token", [True, False])
def test_fp8_fused_weights_scales(card_name, layout, per_token):
    fp8 = card().fp8_e4m3
    x = torch.randn(T, H)
    ids, rw = routing()
    w12, w3 = weights()
    q12, s12, d12 = zip(*(quant_fp8(w, layout, fp8) for w in w12), strict=True)
    q3, s3, d3 = zip(*(quant_fp8(w, layout, fp8) for w in w3), strict=True)
    if per_token:  # dynamic_quant: per-row scale [T, 1]
        xs = x.abs().amax(-1, keepdim=True) / 200
    else:
        xs = x.abs().amax() / 200
    x8 = (x / xs).to(fp8)
    rwb = rw.to(torch.bfloat16)
    got = moe(
        hidden_states=x8,
        expert_routing_table=ids,
        router_weights=rwb,
        w12=list(q12),
        w3=list(q3),
        d_scale_hidden_states=xs,
        d_scale_w12=list(s12),
        d_scale_w3=list(s3),
        permuted_weights=True,
        activation="silu",
        experts_min=0,
        experts_max=E - 1,
    )
    assert got.dtype == torch.bfloat16
    assert_close(got, moe_ref(x8.float() * xs, ids, rwb, d12, d3), torch.bfloat16)


@pytest.mark.parametrize("per_token", [True, False])
def test_fp8_fused_weights_dynamic_named_overload(card_name, per_token):
    """The plugin's named dynamic-scale overload (what the fix moe-explicit-overload calls)
    computes what the packet call with the same arguments computes, against the reference."""
    fp8 = card().fp8_e4m3
    x = torch.randn(T, H)
    ids, rw = routing()
    w12, w3 = weights()
    q12, s12, d12 = zip(*(quant_fp8(w, "channel", fp8) for w in w12), strict=True)
    q3, s3, d3 = zip(*(quant_fp8(w, "channel", fp8) for w in w3), strict=True)
    xs = x.abs().amax(-1, keepdim=True) / 200 if per_token else x.abs().amax() / 200
    x8 = (x / xs).to(fp8)
    rwb = rw.to(torch.bfloat16)
    kwargs = dict(
        hidden_states=x8,
        expert_routing_table=ids,
        router_weights=rwb,
        w12=list(q12),
        w3=list(q3),
        d_scale_hidden_states=xs,
        d_scale_w12=list(s12),
        d_scale_w3=list(s3),
        permuted_weights=True,
        activation="silu",
        experts_min=0,
        experts_max=E - 1,
    )
    named = torch.ops.hpu.mixture_of_experts.fp8_fused_weights_dynamic(**kwargs)
    assert torch.equal(named, moe(**kwargs))
    assert_close(named, moe_ref(x8.float() * xs, ids, rwb, d12, d3), torch.bfloat16)
    with pytest.raises((RuntimeError, TypeError)):  # no intermediate scales in this overload
        torch.ops.hpu.mixture_of_experts.fp8_fused_weights_dynamic(
            **kwargs, d_scale_intermediate_hidden_states=[torch.tensor(1.0)] * E
        )


def test_fp8_static_intermediate_scale(card_name):
    fp8 = card().fp8_e4m3
    x = torch.randn(T, H)
    ids, rw = routing()
    w12, w3 = weights()
    q12, s12, d12 = zip(*(quant_fp8(w, "channel", fp8) for w in w12), strict=True)
    q3, s3, d3 = zip(*(quant_fp8(w, "channel", fp8) for w in w3), strict=True)
    xs = torch.tensor(0.02)
    x8 = (x / xs).to(fp8)
    inter = [torch.tensor(0.01 * (e + 1)) for e in range(E)]
    lim = 240.0 if card().name == "gaudi2" else float(torch.finfo(fp8).max)

    def inter_q(j, a):
        return torch.clamp(a / inter[j], -lim, lim).to(fp8).float() * inter[j]

    got = moe(
        hidden_states=x8,
        expert_routing_table=ids,
        router_weights=rw,
        w12=list(q12),
        w3=list(q3),
        d_scale_hidden_states=xs,
        d_scale_intermediate_hidden_states=inter,
        d_scale_w12=list(s12),
        d_scale_w3=list(s3),
        permuted_weights=True,
        activation="silu",
        experts_min=0,
        experts_max=E - 1,
    )
    assert_close(got, moe_ref(x8.float() * xs, ids, rw, d12, d3, inter_q=inter_q), atol=1e-4, rtol=1e-4)


# ---- MXFP4 ----


def _glm5_mxfp4():
    for p in REPO_PATHS:
        if p not in sys.path:
            sys.path.insert(0, p)
    return pytest.importorskip("glm5_mxfp4.mxfp4")


def mxfp4_weights(n, rows, cols, seed):
    mx = _glm5_mxfp4()
    g = torch.Generator().manual_seed(seed)
    packed, scales, deq = [], [], []
    for _ in range(n):
        w = (torch.randn(rows, cols, generator=g) / 4).to(torch.bfloat16)
        q, s = mx.quantize_reference(w.view(torch.int16).numpy().view(np.uint16))
        packed.append(torch.from_numpy(np.ascontiguousarray(q)))
        scales.append(torch.from_numpy(np.ascontiguousarray(s)))
        deq.append(torch.from_numpy(mx.dequantize(q, s)))
    return packed, scales, deq


def test_mxfp4_dequant_matches_project_reference_and_hand_values():
    packed, scales, deq = mxfp4_weights(1, 4, 64, seed=2)
    assert torch.equal(M.dequant_mxfp4(packed[0], scales[0]), deq[0])
    # hand-made: byte 0x9A = low nibble 0xA (-1.0), high nibble 0x9 (-0.5); scale code 128 = 2.0
    p = torch.tensor([[0x9A] + [0x71] * 15], dtype=torch.uint8)
    s = torch.tensor([[128]], dtype=torch.uint8)
    got = M.dequant_mxfp4(p, s)
    assert got[0, :4].tolist() == [-2.0, -1.0, 1.0, 12.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_fused_weights(dtype):
    H2, I2 = 64, 32
    x = torch.randn(T, H2).to(dtype)
    ids, rw = routing()
    p12, s12, d12 = mxfp4_weights(E, 2 * I2, H2, seed=3)
    p3, s3, d3 = mxfp4_weights(E, H2, I2, seed=4)
    lo, hi = 1, 2  # an expert-parallel slice
    got = torch.ops.hpu.mixture_of_experts.mxfp4_fused_weights(
        x,
        ids.to(torch.int32),
        rw.to(dtype),
        p12[lo : hi + 1],
        p3[lo : hi + 1],
        s12[lo : hi + 1],
        s3[lo : hi + 1],
        block_size=32,
        permuted_weights=True,
        activation="silu",
        experts_min=lo,
        experts_max=hi,
        is_fp4=True,
        chunk_size=0,
        total_experts=E,
    )
    ref = moe_ref(x, ids, rw.to(dtype), d12[lo : hi + 1], d3[lo : hi + 1], lo=lo, hi=hi)
    assert_close(got, ref, dtype, atol=5e-2 if dtype == torch.bfloat16 else 1e-4)


def test_bias_mxfp4_fused_weights():
    H2, I2 = 64, 32
    x = torch.randn(T, H2).to(torch.bfloat16)
    ids, rw = routing()
    p12, s12, d12 = mxfp4_weights(E, 2 * I2, H2, seed=5)
    p3, s3, d3 = mxfp4_weights(E, H2, I2, seed=6)
    g = torch.Generator().manual_seed(7)
    b12 = [torch.randn(2 * I2, generator=g).to(torch.bfloat16) for _ in range(E)]
    b3 = [torch.randn(H2, generator=g).to(torch.bfloat16) for _ in range(E)]
    got = torch.ops.hpu.mixture_of_experts.bias_mxfp4_fused_weights(
        x,
        ids.to(torch.int32),
        rw.to(torch.bfloat16),
        p12,
        p3,
        b12,
        b3,
        s12,
        s3,
        block_size=32,
        permuted_weights=True,
        experts_min=0,
        experts_max=E - 1,
        is_fp4=True,
        chunk_size=0,
        total_experts=E,
        alpha=1.5,
        limit=3.0,
    )
    ref = moe_ref(x, ids, rw.to(torch.bfloat16), d12, d3, b12=b12, b3=b3, gated=lambda h: swiglu_oai_ref(h, 1.5, 3.0))
    assert_close(got, ref, torch.bfloat16, atol=5e-2)


def test_moe_not_emulated_raises():
    x = torch.randn(T, H)
    ids, rw = routing()
    w12, w3 = weights()
    with pytest.raises(NotImplementedError, match="activation"):
        moe(
            hidden_states=x,
            expert_routing_table=ids,
            router_weights=rw,
            w12=w12,
            w3=w3,
            activation="tanh",
            experts_min=0,
            experts_max=E - 1,
        )
    with pytest.raises(NotImplementedError, match="biases"):  # bias slices with the whole weight list
        M.mixture_of_experts_bias_fused(x, ids, rw, w12, w3, w3[:2], w3[:2], True, 0, E - 1)
    with pytest.raises(NotImplementedError, match="is_fp4"):
        M.mixture_of_experts_mxfp4_fused(x, ids, rw, w12, w3, w12, w3, is_fp4=False, experts_max=E - 1)


def _swap_gate_up(h):
    g, u = h.chunk(2, dim=-1)
    return F.silu(u) * g


MOE_MUTANTS = {
    "gate_up_swapped": lambda kw: M._moe(
        kw["x"], kw["ids"], kw["rw"], E, 0, E - 1, lambda e: kw["w12"][e], lambda e: kw["w3"][e], _swap_gate_up
    ),
    "experts_min_off_by_one": lambda kw: M.mixture_of_experts_fused(
        kw["x"], kw["ids"], kw["rw"], kw["w12"], kw["w3"], True, "silu", 1, E
    ),
    "router_weight_ignored": lambda kw: M.mixture_of_experts_fused(
        kw["x"], kw["ids"], torch.ones_like(kw["rw"]) / TOPK, kw["w12"], kw["w3"], True, "silu", 0, E - 1
    ),
}


@pytest.mark.parametrize("mutant", [None, *MOE_MUTANTS])
def test_negative_control_moe(mutant):
    x = torch.randn(T, H)
    ids, rw = routing()
    w12, w3 = weights()
    kw = dict(x=x, ids=ids, rw=rw, w12=w12, w3=w3)
    if mutant is None:
        got = M.mixture_of_experts_fused(x, ids, rw, w12, w3, True, "silu", 0, E - 1)
    else:
        got = MOE_MUTANTS[mutant](kw)
    assert close(got, moe_ref(x, ids, rw, w12, w3)) == (mutant is None)
