"""RMSNorm, RoPE, FP8 casts / GEMM, block softmax, uint4 dequantisation, op registration.

Independent references: torch.nn.functional.rms_norm; RoPE as complex multiplication; FP8 via
torch's own float8 casts; paged attention (block_softmax + adjustment) vs dense SDPA per
sequence; uint4 via bit-by-bit packing in Python loops. Tolerances: see packtests/kernel_checks.py TOL.
"""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hpu_emulation import ops
from hpu_emulation.config import card
from hpu_emulation.kernels import fp8 as FP8
from hpu_emulation.kernels import quant as Q
from hpu_emulation.kernels import rope as R
from packtests.kernel_checks import assert_close, close

ops.register()
DTYPES = [torch.float32, torch.bfloat16]


# ---- RMSNorm ----


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_rms_norm(dtype):
    norm = importlib.import_module("habana_frameworks.torch.hpex.normalization").FusedRMSNorm
    x = (torch.randn(2, 5, 32) * 3).to(dtype)
    w = torch.randn(32).to(dtype)
    got = norm.apply(x, w, 1e-5)
    ref = F.rms_norm(x.float(), (32,), w.float(), eps=1e-5)
    assert got.dtype == dtype
    assert_close(got, ref, dtype)
    assert not close(norm.apply(x, w, 1.0), ref, dtype)  # negative control: eps matters


# ---- RoPE ----


def cos_sin(tokens, rot, neox):
    """As HPURotaryEmbedding.prepare_cos_sin builds them: [T, 1, rot]."""
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    ang = torch.arange(tokens).float()[:, None] * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    if neox:
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), ang
    return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1), ang


def rope_complex(x, ang, neox):
    """Reference: rotate pairs as complex numbers by e^(i * angle)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    if neox:
        z = torch.complex(xf[..., :half], xf[..., half:])
    else:
        z = torch.complex(xf[..., 0::2], xf[..., 1::2])
    z = z * torch.polar(torch.ones_like(ang), ang)[:, None]
    if neox:
        return torch.cat((z.real, z.imag), -1)
    return torch.stack((z.real, z.imag), -1).flatten(-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["BLOCKWISE", "PAIRWISE"])
def test_apply_rotary_pos_emb(dtype, mode):
    k = importlib.import_module("habana_frameworks.torch.hpex.kernels")
    neox = mode == "BLOCKWISE"
    x = torch.randn(6, 3, 16).to(dtype)
    cos, sin, ang = cos_sin(6, 16, neox)
    got = k.apply_rotary_pos_emb(x, cos.to(dtype), sin.to(dtype), None, 0, getattr(k.RotaryPosEmbeddingMode, mode))
    assert got.dtype == dtype
    assert_close(got, rope_complex(x, ang, neox), dtype)
    # negative control: the other mode's rotation does not match
    other = R.RotaryPosEmbeddingMode.PAIRWISE if neox else R.RotaryPosEmbeddingMode.BLOCKWISE
    assert not close(R.rotary_pos_embedding(x, sin, cos, None, 0, other), rope_complex(x, ang, neox), dtype)


def test_rope_not_emulated_raises():
    x = torch.randn(2, 1, 4)
    with pytest.raises(NotImplementedError):
        R.rotary_pos_embedding(x, x, x, torch.zeros(2, dtype=torch.long), 0, 0)
    with pytest.raises(NotImplementedError):
        R.rotary_pos_embedding(x, x, x, None, 3, 0)


# ---- FP8 ----


def test_cast_to_fp8_v2_matches_torch_cast(card_name):
    fp8 = card().fp8_e4m3
    lim = 240.0 if card_name == "gaudi2" else 448.0
    x = torch.randn(8, 16) * 10
    scale = torch.tensor(2.0)
    out, amax = torch.ops.hpu.cast_to_fp8_v2(x, scale, False, True, fp8)
    assert out.dtype == fp8
    assert torch.equal(out.float(), (x * 2).clamp(-lim, lim).to(fp8).float())
    assert float(amax) == float(x.abs().max())
    # dtype None: the card's e4m3
    assert torch.ops.hpu.cast_to_fp8_v2(x, 0.5, False, False, None)[0].dtype == fp8
    # saturation (a bare torch cast overflows instead); Gaudi 2 saturates e4m3fn at 240 as well
    big = torch.tensor([1e6, -1e6, 300.0])
    sat = torch.ops.hpu.cast_to_fp8_v2(big, 1.0, False, False, torch.float8_e4m3fn)[0].float()
    want = [240.0, -240.0, 240.0] if card_name == "gaudi2" else [448.0, -448.0, 288.0]
    assert sat.tolist() == want
    # per-row scale [T, 1] (dynamic_quant)
    rs = torch.rand(8, 1) + 0.5
    assert torch.equal(
        torch.ops.hpu.cast_to_fp8_v2(x, rs, False, False, fp8)[0].float(), (x * rs).clamp(-lim, lim).to(fp8).float()
    )


def test_cast_from_fp8_both_fp8_dtypes():
    for fp8 in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        x8 = (torch.randn(4, 8) * 4).to(fp8)
        got = torch.ops.hpu.cast_from_fp8(x8, 0.25, torch.bfloat16)
        assert got.dtype == torch.bfloat16
        assert torch.equal(got.float(), (x8.float() * 0.25).to(torch.bfloat16).float())
        got_t = torch.ops.hpu.cast_from_fp8(x8, torch.tensor(0.25), torch.float32)
        assert torch.equal(got_t, x8.float() * 0.25)


@pytest.mark.parametrize("trans_b", [True, False])
def test_fp8_gemm_v2(card_name, trans_b):
    fp8 = card().fp8_e4m3
    a = (torch.randn(5, 16) * 8).to(fp8)
    w = (torch.randn(12, 16) * 8).to(fp8)  # [N, K] like a linear weight
    b = w if trans_b else w.t().contiguous()
    a_s = torch.rand(5, 1) + 0.1  # per token
    b_s = torch.rand(12) + 0.1  # per output channel
    bias = torch.randn(12).to(torch.bfloat16)
    got = torch.ops.hpu.fp8_gemm_v2(
        A=a,
        trans_A=False,
        B=b,
        trans_B=trans_b,
        D=None,
        out_dtype=torch.bfloat16,
        A_scale_inv=a_s,
        B_scale_inv=b_s,
        bias=bias,
        accumulate=False,
    )
    ref = (a.float() * a_s) @ (w.float() * b_s[:, None]).t() + bias.float()
    assert_close(got, ref, torch.bfloat16)
    # float scales (FP8Matmul) resolve to the .scalar overload
    got_s = torch.ops.hpu.fp8_gemm_v2(
        A=a,
        trans_A=False,
        B=b,
        trans_B=trans_b,
        D=None,
        out_dtype=torch.float32,
        A_scale_inv=0.5,
        B_scale_inv=0.25,
        bias=None,
        accumulate=False,
    )
    assert_close(got_s, (a.float() @ w.float().t()) * 0.125)
    # negative control: treating the scales as quantisation (not dequantisation) scales is caught
    wrong = (a.float() / a_s) @ (w.float() / b_s[:, None]).t() + bias.float()
    assert not close(got, wrong, torch.bfloat16)


def test_fp8_not_emulated_raises():
    x = torch.randn(2, 2)
    with pytest.raises(NotImplementedError, match="stochastic"):
        torch.ops.hpu.cast_to_fp8_v2(x, 1.0, True, False, torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="block"):
        FP8.fp8_gemm_v2(x, False, x, False, None, torch.float32, None, torch.ones(2, 2, 2))


# ---- block softmax (flat_pa decode) ----


def paged_decode(q, k_blocks, v_blocks, bias, groups, mapping, batch, softmax, adjust):
    """The fused branch of ops.py:pipelined_pa, wrapped as flat_pa does for a GQA layout."""
    kvh = k_blocks.shape[1]
    qb = (mapping @ q.flatten(1)).view(-1, q.shape[1], q.shape[2])  # batch2block
    qb = qb.unflatten(1, (kvh, -1)).unsqueeze(-2)  # [B, kvh, G, 1, D]
    kb = k_blocks.unsqueeze(2)  # [B, kvh, 1, bs, D]
    vb = v_blocks.unsqueeze(2)
    attn = qb @ kb.transpose(-1, -2)  # [B, kvh, G, 1, bs]
    attn, bmax, bsum = softmax(attn, bias.view(-1, 1, 1, 1, bias.shape[-1]), groups)
    attn = attn @ vb
    rescale = adjust(bmax, bsum, groups, batch, list(attn.shape[:3]) + [1] * (attn.dim() - 3))
    attn = attn * rescale
    out = (mapping.t() @ attn.flatten(1)).view(batch, *attn.shape[1:])  # block2batch
    return out.squeeze(-2).flatten(1, 2)


def dense_ref(q, k_blocks, v_blocks, owners, lens, bs):
    outs = []
    for b in range(q.shape[0]):
        blocks = [i for i, o in enumerate(owners) if o == b]
        k = torch.cat([k_blocks[i] for i in blocks], dim=1)[:, : lens[b]]
        v = torch.cat([v_blocks[i] for i in blocks], dim=1)[:, : lens[b]]
        rep = q.shape[1] // k.shape[0]
        outs.append(
            F.scaled_dot_product_attention(
                q[b][:, None], k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0), scale=1.0
            )[:, 0]
        )
    return torch.stack(outs)


def _paged_case():
    g = torch.Generator().manual_seed(0)
    batch, bs, kvh, hq, d = 3, 4, 2, 4, 8
    owners = [0, 1, 1, 2, 2, 2, 3]  # the last block is padding (group == batch)
    lens = [3, 6, 12]
    q = torch.randn(batch, hq, d, generator=g) * 2
    k_blocks = torch.randn(len(owners), kvh, bs, d, generator=g)
    v_blocks = torch.randn(len(owners), kvh, bs, d, generator=g)
    groups = torch.tensor(owners)
    mapping = F.one_hot(groups.clamp(max=batch), batch + 1)[:, :batch].float()
    bias = torch.zeros(len(owners), bs)
    pos_in_seq = {}
    for i, o in enumerate(owners):
        start = pos_in_seq.get(o, 0)
        pos_in_seq[o] = start + bs
        if o < batch:
            bias[i] = torch.where(torch.arange(start, start + bs) < lens[o], 0.0, -math.inf)
    return q, k_blocks, v_blocks, bias, groups, mapping, batch, owners, lens, bs


def test_block_softmax_pipeline_matches_dense_attention():
    q, kb, vb, bias, groups, mapping, batch, owners, lens, bs = _paged_case()
    got = paged_decode(
        q, kb, vb, bias, groups, mapping, batch, torch.ops.hpu.block_softmax, torch.ops.hpu.block_softmax_adjustment
    )
    assert_close(got, dense_ref(q, kb, vb, owners, lens, bs), atol=1e-5, rtol=1e-4)


def test_block_softmax_matches_native_branch():
    """The op equals the native branch it replaces (add bias, block max, exp, sums)."""
    attn = torch.randn(5, 2, 2, 1, 4, dtype=torch.bfloat16)
    bias = torch.randn(5, 1, 1, 1, 4, dtype=torch.bfloat16)
    e, bmax, bsum = torch.ops.hpu.block_softmax(attn, bias, torch.zeros(5, dtype=torch.long))
    a = attn.float() + bias.float()
    assert e.dtype == torch.bfloat16
    assert_close(bmax, a.amax(-1, keepdim=True), torch.bfloat16)
    assert_close(e, torch.exp(a - a.amax(-1, keepdim=True)), torch.bfloat16)
    assert_close(bsum, torch.exp(a - a.amax(-1, keepdim=True)).sum(-1, keepdim=True), torch.bfloat16)


def test_negative_control_block_softmax_adjustment():
    q, kb, vb, bias, groups, mapping, batch, owners, lens, bs = _paged_case()

    def no_group_norm(bmax, bsum, groups, batch_size, out_shape):  # each block normalised alone
        return (1.0 / bsum).reshape(out_shape)

    got = paged_decode(q, kb, vb, bias, groups, mapping, batch, torch.ops.hpu.block_softmax, no_group_norm)
    assert not close(got, dense_ref(q, kb, vb, owners, lens, bs), atol=1e-5, rtol=1e-4)


# ---- convert_from_uint4 ----


def pack_loops(vals):
    """int [R, C] (0..15) -> int32 [R, C / 8], value j of each word at bits 4j..4j+3."""
    rows, cols = vals.shape
    out = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for r in range(rows):
        for c in range(cols):
            out[r, c // 8] |= int(vals[r, c]) << (4 * (c % 8))
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


@pytest.mark.parametrize("use_gidx", [False, True])
def test_convert_from_uint4(use_gidx):
    g = torch.Generator().manual_seed(0)
    rows, cols, group = 16, 16, 4
    w = torch.randint(0, 16, (rows, cols), generator=g)
    z = torch.randint(0, 16, (rows // group, cols), generator=g)
    s = torch.rand(rows // group, cols, generator=g).to(torch.bfloat16)
    gidx = torch.randperm(rows, generator=g) % (rows // group) if use_gidx else None
    got = torch.ops.hpu.convert_from_uint4(pack_loops(w), s, pack_loops(z), torch.bfloat16, gidx)
    ref = torch.empty(rows, cols)
    for r in range(rows):
        grp = int(gidx[r]) if use_gidx else r // group
        for c in range(cols):
            ref[r, c] = (int(w[r, c]) - int(z[grp, c])) * float(s[grp, c])
    assert got.dtype == torch.bfloat16
    assert_close(got, ref, torch.bfloat16)
    # negative control: reading the nibbles high-first gives something else
    flipped = Q.unpack_uint4(pack_loops(w)).view(rows, -1, 8).flip(-1).flatten(1)
    assert not torch.equal(flipped, w.to(torch.int32))
    assert torch.equal(Q.unpack_uint4(pack_loops(w)), w.to(torch.int32))


# ---- registration ----


def test_register_idempotent_and_one_op_per_call():
    ops.register()
    ops.register()
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q = torch.randn(1, 4, 5, 8)
    k = torch.randn(1, 2, 5, 8)
    fsdpa = importlib.import_module("habana_frameworks.torch.hpex.kernels").FusedSDPA
    with Log():
        fsdpa.apply(q, k, k, None, 0.0, True, None, "fast", True, None, "right")
    assert seen == ["hpu.sdpa_recomp_fwd.default"]


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 5, 8)
        k = torch.empty(2, 2, 7, 8)
        out, m, linv = torch.ops.hpu.sdpa_recomp_fwd(q, k, k, None, 0.0, 0.1, False, True, "fast", None, "right")
        assert out.shape == (2, 4, 5, 8) and m.shape == (2, 4, 5, 1)
        x = torch.empty(3, 16, dtype=torch.bfloat16)
        w = [torch.empty(8, 16)] * 2
        y = torch.ops.hpu.mixture_of_experts(
            hidden_states=x,
            expert_routing_table=torch.empty(3, 2, dtype=torch.long),
            router_weights=torch.empty(3, 2),
            w12=w,
            w3=[torch.empty(16, 4)] * 2,
            permuted_weights=True,
            activation="silu",
            experts_min=0,
            experts_max=1,
        )
        assert y.shape == (3, 16) and y.dtype == torch.bfloat16
        c, _ = torch.ops.hpu.cast_to_fp8_v2(x, 1.0, False, False, torch.float8_e4m3fn)
        assert c.dtype == torch.float8_e4m3fn
        q8 = torch.empty(2, 4, 5, 8, dtype=torch.float8_e4m3fn)
        one = torch.empty(())
        r = torch.ops.hpu.fp8_sdpa_recomp_fwd(
            q8, q8, q8, None, 0.0, 0.1, True, True, "fast", one, one, one, one, None, one, True, False, None, "right"
        )
        assert r[0].dtype == torch.bfloat16 and r[0].shape == (2, 4, 5, 8) and r[3].shape == ()
