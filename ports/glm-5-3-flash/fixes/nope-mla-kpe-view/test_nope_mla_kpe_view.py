"""HPU MLA prefill (HPUMLAImpl.forward_mha) on a NoPE MLA layer: qk_rope_head_dim == 0, as in
GLM-5.3-Flash's 11 MLA layers. The real forward_mha runs; only the fused HPU attention kernel
(ops.prompt_attention) is replaced by a CPU causal attention with the same contract."""

import types

import pytest
import torch
import torch.nn.functional as F

HEADS, NOPE, VDIM, RANK, TOKENS = 4, 16, 16, 32, 7


def cpu_prompt_attention(*, query, key, value, is_causal, scale, **_):
    # [B, S, H, D] in and out, like the HPU op.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale).transpose(1, 2)


def make_impl(hpu_attn, rope: int, w_kv_b: torch.Tensor):
    impl = object.__new__(hpu_attn.HPUMLAImpl)
    torch.nn.Module.__init__(impl)
    impl.num_heads = HEADS
    impl.kv_lora_rank = RANK
    impl.qk_nope_head_dim = NOPE
    impl.qk_rope_head_dim = rope
    impl.qk_head_dim = NOPE + rope
    impl.v_head_dim = VDIM
    impl.scale = (NOPE + rope) ** -0.5
    impl.use_merged_prefill = False
    impl.kv_b_proj = lambda x: (x @ w_kv_b.T, None)  # ColumnParallelLinear returns (out, bias)
    for name in ("prefill_impl", "matmul_qk", "softmax", "matmul_av", "fused_scaled_dot_product_attention"):
        setattr(impl, name, None)
    impl.latent_cache_k = types.SimpleNamespace(fetch_from_cache=None)  # no cached prefix here (block_list is None)
    return impl


@pytest.fixture()
def hpu_attn(tree, monkeypatch):
    from vllm_gaudi.attention.backends import hpu_attn

    monkeypatch.setattr(hpu_attn.ops, "prompt_attention", cpu_prompt_attention)
    return hpu_attn


def reference(q, latent, w_kv_b, rope):
    c, k_pe = latent.split([RANK, rope], dim=-1)
    kv = (c @ w_kv_b.T).view(-1, HEADS, NOPE + VDIM)
    k_nope, v = kv.split([NOPE, VDIM], dim=-1)
    k = torch.cat((k_nope, k_pe[:, None, :].expand(-1, HEADS, -1)), dim=-1)
    out = cpu_prompt_attention(
        query=q.view(1, -1, HEADS, NOPE + rope), key=k[None], value=v[None], is_causal=True, scale=(NOPE + rope) ** -0.5
    )
    return out.reshape(-1, HEADS * VDIM)


@pytest.mark.parametrize("rope", [0, 8], ids=["nope", "rope8"])
@pytest.mark.red_raises("RuntimeError")  # the defect: view(-1, 1, 0) of the empty rope key
def test_mla_prefill_attention(hpu_attn, rope):
    g = torch.Generator().manual_seed(0)
    w_kv_b = torch.randn(HEADS * (NOPE + VDIM), RANK, generator=g) * 0.2
    q = torch.randn(TOKENS, HEADS, NOPE + rope, generator=g)
    latent = torch.randn(TOKENS, RANK + rope, generator=g)
    meta = types.SimpleNamespace(
        block_list=None, seq_lens_tensor=torch.tensor([TOKENS]), attn_bias=None, block_size=128
    )

    impl = make_impl(hpu_attn, rope, w_kv_b)
    out = impl.forward_mha(q, latent, None, meta)

    assert out.shape == (TOKENS, HEADS * VDIM)
    torch.testing.assert_close(out, reference(q, latent, w_kv_b, rope), rtol=1e-5, atol=1e-5)
