"""FusedSDPA and its op forms vs torch.nn.functional.scaled_dot_product_attention.

References build every mask explicitly (float -inf masks, GQA by repeat_interleave of the kv
heads) and call PyTorch's SDPA; the sink reference rescales SDPA's output with a log-sum-exp
computed by torch.logsumexp. Tolerances: see packtests/kernel_checks.py TOL.
"""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from hpu_emulation import ops
from hpu_emulation.kernels import attention as A
from hpu_emulation.kernels.fp8 import fp8_quantize
from packtests.kernel_checks import assert_close, close

ops.register()
DTYPES = [torch.float32, torch.bfloat16]


def qkv(b=2, hq=4, hkv=2, s=6, d=8, dtype=torch.float32, seed=0, kv_len=None):
    g = torch.Generator().manual_seed(seed)
    kv_len = kv_len or s
    q = torch.randn(b, hq, s, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, kv_len, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, kv_len, d, generator=g).to(dtype)
    return q, k, v


def ref_sdpa(q, k, v, mask=None, scale=None, sinks=None):
    """PyTorch SDPA in float32 on repeated kv heads; ``mask`` is a float additive mask."""
    rep = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(rep, dim=1)
    v = v.float().repeat_interleave(rep, dim=1)
    q = q.float()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if sinks is not None:
        s = q @ k.transpose(-1, -2) * scale
        if mask is not None:
            s = s + mask
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        sink = sinks.float().view(1, -1, 1, 1)
        out = out * torch.sigmoid(lse - sink)  # = e^lse / (e^lse + e^sink)
    return out


def float_mask(allowed):
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


def causal(s, kv=None):
    kv = kv or s
    return torch.ones(s, kv, dtype=torch.bool).tril()


def apply_fsdpa():
    return importlib.import_module("habana_frameworks.torch.hpex.kernels").FusedSDPA.apply


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hkv", [4, 2, 1])
@pytest.mark.parametrize("is_causal", [False, True])
def test_fsdpa_gqa_causal(dtype, hkv, is_causal):
    q, k, v = qkv(hkv=hkv, dtype=dtype)
    got = apply_fsdpa()(q, k, v, None, 0.0, is_causal, None, "fast", True, None, "right")
    mask = float_mask(causal(6)) if is_causal else None
    assert got.dtype == dtype and got.shape == q.shape
    assert_close(got, ref_sdpa(q, k, v, mask), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fsdpa_additive_and_bool_mask_with_scale(dtype):
    q, k, v = qkv(dtype=dtype, kv_len=9)
    g = torch.Generator().manual_seed(3)
    allowed = torch.rand(2, 1, 6, 9, generator=g) > 0.3
    allowed[..., 0] = True  # every row sees something
    bias = float_mask(allowed) + torch.randn(2, 1, 6, 9, generator=g)
    ref = ref_sdpa(q, k, v, bias, scale=0.3)
    assert_close(apply_fsdpa()(q, k, v, bias.to(dtype), 0.0, False, 0.3, "None", False, None, "right"), ref, dtype)
    # Boolean masks: True = attend (PyTorch's convention).
    ref_b = ref_sdpa(q, k, v, float_mask(allowed), scale=0.3)
    assert_close(apply_fsdpa()(q, k, v, allowed, 0.0, False, 0.3, "fp32", None, None, "left"), ref_b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_fsdpa_valid_sequence_lengths(dtype, side):
    q, k, v = qkv(dtype=dtype)
    lens = torch.tensor([4, 6])
    got = apply_fsdpa()(q, k, v, None, 0.0, True, None, "fast", True, lens, side)
    cols = torch.arange(6).view(1, 1, 1, -1)
    key_ok = cols < lens.view(-1, 1, 1, 1) if side == "right" else cols >= 6 - lens.view(-1, 1, 1, 1)
    allowed = causal(6) & key_ok
    ref = ref_sdpa(q, k, v, float_mask(allowed))
    rows_with_keys = allowed.any(-1, keepdim=True).expand(-1, 4, -1, 8)
    # Rows that see no key (left padding) are 0 in the emulation; SDPA gives NaN there.
    assert_close(got[rows_with_keys], ref[rows_with_keys], dtype)
    assert torch.all(got[~rows_with_keys] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [1, 3])
def test_fsdpa_sliding_window_matches_runner_mask(dtype, window):
    # The runner's own mask for the same window (hpu_model_runner._set_attn_bias_for_sliding_window).
    q, k, v = qkv(dtype=dtype)
    got = apply_fsdpa()(q, k, v, None, 0.0, True, None, "fast", True, None, "right", False, False, (window, 0))
    mask = torch.log(torch.ones(6, 6).tril(0).triu(1 - window))
    assert_close(got, ref_sdpa(q, k, v, mask), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fsdpa_sinks_gqa(dtype):
    q, k, v = qkv(hkv=2, dtype=dtype)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]).to(dtype)
    got = apply_fsdpa()(q, k, v, None, 0.0, True, None, "fast", True, None, "right", False, False, None, sinks)
    assert_close(got, ref_sdpa(q, k, v, float_mask(causal(6)), sinks=sinks.float()), dtype)


def test_fsdpa_no_window_sentinel_and_fast_mode_same_math():
    q, k, v = qkv()
    a = apply_fsdpa()(q, k, v, None, 0.0, True, None, "fast", True, None, "right", False, False, (-1, -1))
    b = apply_fsdpa()(q, k, v, None, 0.0, True, None, "None", False, None, "right")
    assert torch.equal(a, b)


def test_sdpa_recomp_fwd_stats_and_chunk_merge():
    """m / linv as SlicedFusedSDPA._merge_chunk uses them: merging two kv chunks = whole."""
    q, k, v = qkv(hkv=2, kv_len=10)
    q5, k5, v5, _ = A.gqa_input_reshape_fwd(q, k, v, None)
    out, m, linv = torch.ops.hpu.sdpa_recomp_fwd(q5, k5, v5, None, 0.0, 0.25, False, True, "fast", None, "right")
    s = (q.float() @ k.float().repeat_interleave(2, 1).transpose(-1, -2)) * 0.25
    assert_close(A.gqa_output_reshape(m), s.amax(-1, keepdim=True))
    assert_close(A.gqa_output_reshape(linv), torch.exp(s.amax(-1, keepdim=True) - torch.logsumexp(s, -1, keepdim=True)))

    def chunk(lo, hi):
        r = torch.ops.hpu.sdpa_recomp_fwd(
            q5, k5[..., lo:hi, :], v5[..., lo:hi, :], None, 0.0, 0.25, False, True, "fast", None, "right"
        )
        return [A.gqa_output_reshape(x).float() for x in r]

    (o1, m1, l1), (o2, m2, l2) = chunk(0, 4), chunk(4, 10)
    new_m = torch.maximum(m1, m2)
    r1, r2 = (1 / l1) * torch.exp(m1 - new_m), (1 / l2) * torch.exp(m2 - new_m)
    new_l = 1 / (r1 + r2)
    merged = (r1 * new_l) * o1 + (r2 * new_l) * o2
    assert_close(merged, ref_sdpa(q, k, v, scale=0.25))
    assert_close(A.gqa_output_reshape(out), merged)


def test_gqa_mask_reshape_per_head_mask():
    q, k, v = qkv(hkv=2)
    bias = torch.randn(2, 4, 6, 6)
    got = apply_fsdpa()(q, k, v, bias, 0.0, False, None, "fast", True, None, "right")
    assert_close(got, ref_sdpa(q, k, v, bias))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dropout_p=0.1),
        dict(softmax_mode="turbo"),
        dict(is_causal=True, kv_len=8),  # q_len != kv_len alignment is not documented
    ],
)
def test_fsdpa_not_emulated_raises(kwargs):
    kv_len = kwargs.pop("kv_len", None)
    q, k, v = qkv(kv_len=kv_len)
    with pytest.raises(NotImplementedError):
        A.fused_sdpa(q, k, v, **kwargs)


@pytest.mark.parametrize("fp8_kind", ["card", "e5m2"])
def test_fp8_fused_sdpa_dequantized_inputs(card_name, fp8_kind):
    from hpu_emulation.config import card

    fp8 = card().fp8_e4m3 if fp8_kind == "card" else torch.float8_e5m2
    q, k, v = qkv(hkv=2)
    sq, sk, sv = (x.abs().amax() / 100 for x in (q, k, v))
    q8, k8, v8 = (fp8_quantize(x / s, fp8) for x, s in ((q, sq), (k, sk), (v, sv)))
    fsdpa = importlib.import_module("habana_frameworks.torch.hpex.kernels").fp8_fused_sdpa
    res = fsdpa(
        q8,
        k8,
        v8,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=True,
        scale=None,
        softmax_mode="None",
        d_scale_q=sq,
        d_scale_k=sk,
        d_scale_v=sv,
        q_scale_s=None,
        d_scale_s=None,
        is_amax_s=False,
        valid_seq_len=None,
        seq_padding_type="right",
    )
    ref = ref_sdpa(q8.float() * sq, k8.float() * sk, v8.float() * sv, float_mask(causal(6)))
    assert res[0].dtype == torch.bfloat16
    assert_close(res[0], ref, torch.bfloat16)


def test_fp8_sdpa_recomp_fwd_prob_quant_and_fast_linv(card_name):
    """With q_scale_s the probabilities pass through FP8 (close to, not equal to, exact); 'fast' linv / 128."""
    from hpu_emulation.config import card

    fp8 = card().fp8_e4m3
    q, k, v = qkv(hkv=2)
    q8, k8, v8 = (fp8_quantize(x * 8, fp8) for x in (q, k, v))
    one = torch.tensor(1.0)
    d = torch.tensor(1 / 8)
    args = (q8, k8, v8, None, 0.0, 0.3, True, True)
    tail = (d, d, d, one, None, one, True, False, None, "right")
    out_f, m_f, l_f, amax_s, _ = torch.ops.hpu.fp8_sdpa_recomp_fwd(*args, "fast", *tail)
    out_n, m_n, l_n, _, _ = torch.ops.hpu.fp8_sdpa_recomp_fwd(*args, "None", *tail)
    ref = ref_sdpa(q8.float() / 8, k8.float() / 8, v8.float() / 8, float_mask(causal(6)), scale=0.3)
    assert_close(out_n, ref, torch.bfloat16, atol=6e-2, rtol=6e-2)  # P carries FP8 rounding (2**-4)
    assert not torch.equal(out_n.float(), ref.to(torch.bfloat16).float())  # ... and it really is quantised
    assert_close(l_f * 128, l_n)
    assert float(amax_s) == pytest.approx(1.0)  # unnormalised P peaks at exp(0)


MUTANTS = {
    # Deliberately wrong kernels: the same checks must reject each of them.
    "scale_ignored": lambda q, k, v, **kw: A.fused_sdpa(
        q, k, v, scale=1.0, **{x: y for x, y in kw.items() if x != "scale"}
    ),
    "window_off_by_one": lambda q, k, v, **kw: A.fused_sdpa(
        q, k, v, **dict(kw, window_size=(kw["window_size"][0] + 1, 0))
    ),
    # query head h on kv head h % Hkv (tiling) instead of h // G
    "wrong_gqa_grouping": lambda q, k, v, **kw: A.fused_sdpa(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), **kw),
}


@pytest.mark.parametrize("mutant", [None, *MUTANTS])
def test_negative_control_attention(mutant):
    """The reference comparison passes for the kernel and fails for each mutated kernel."""
    q, k, v = qkv(hkv=2)
    kw = dict(is_causal=True, scale=0.2, window_size=(3, 0), padding_side="right")
    fn = A.fused_sdpa if mutant is None else MUTANTS[mutant]
    got = fn(q, k, v, **kw)
    mask = torch.log(torch.ones(6, 6).tril(0).triu(1 - 3))
    assert close(got, ref_sdpa(q, k, v, mask, scale=0.2)) == (mutant is None)


def test_fp8_sliced_merge_contract(card_name):
    """SlicedFP8FusedSDPA's chunk_kernel: dequantised chunk outputs, m, linv * 128 ('fast') merge to the whole."""
    from hpu_emulation.config import card

    fp8 = card().fp8_e4m3
    q, k, v = qkv(hkv=2, kv_len=10)
    q8, k8, v8 = (fp8_quantize(x * 8, fp8) for x in (q, k, v))
    d = torch.tensor(1 / 8)
    one = torch.tensor(1.0)
    q5, k5, v5, _ = A.gqa_input_reshape_fwd(q8, k8, v8, None)

    def chunk(lo, hi):
        r = torch.ops.hpu.fp8_sdpa_recomp_fwd(
            q5, k5[..., lo:hi, :], v5[..., lo:hi, :], None, 0.0, 0.25, False, True, "fast",
            d, d, d, one, one, one, False, False, None, "right", [-1, -1], None,
        )  # fmt: skip
        out, m, linv = (A.gqa_output_reshape(x) for x in r[:3])
        out = torch.ops.hpu.cast_from_fp8(out, one, torch.bfloat16).float()
        return out, m.float(), linv.float() * 128.0

    (o1, m1, l1), (o2, m2, l2) = chunk(0, 4), chunk(4, 10)
    new_m = torch.maximum(m1, m2)
    r1, r2 = (1 / l1) * torch.exp(m1 - new_m), (1 / l2) * torch.exp(m2 - new_m)
    new_l = 1 / (r1 + r2)
    merged = (r1 * new_l) * o1 + (r2 * new_l) * o2
    ref = ref_sdpa(q8.float() / 8, k8.float() / 8, v8.float() / 8, scale=0.25)
    # P and the output pass through FP8 (3 mantissa bits): relative error up to ~2**-4 each.
    assert_close(merged, ref, torch.bfloat16, atol=0.15, rtol=0.15)
    assert torch.nn.functional.cosine_similarity(merged.flatten(), ref.flatten(), dim=0) > 0.995


def test_gqa_helpers_import_paths_round_trip():
    """utils.py imports the helpers from both kernel modules; reshape there and back is the identity."""
    from habana_frameworks.torch.hpex.kernels.Fp8FusedSDPA import gqa_output_reshape as out8
    from habana_frameworks.torch.hpex.kernels.FusedSDPA import gqa_input_reshape_fwd, gqa_output_reshape, is_gqa

    q, k, v = qkv(hkv=2)
    mask = torch.randn(2, 4, 6, 6)
    assert is_gqa(q, k) and not is_gqa(q, q)
    q5, k5, v5, m5 = gqa_input_reshape_fwd(q, k, v, mask)
    assert q5.shape == (2, 2, 2, 6, 8) and k5.shape == (2, 2, 1, 6, 8) and m5.shape == (2, 2, 2, 6, 6)
    assert torch.equal(gqa_output_reshape(q5), q) and torch.equal(out8(m5), mask)
