"""glm5_hpu.dsa against transformers 5.23.0's GlmMoeDsa indexer and attention on a tiny config.

transformers applies the indexer's top-k at every length; glm5_hpu.dsa applies it once a query
sees more than ``threshold`` keys. With the threshold lowered to index_topk the two select the
same keys and give the same outputs; above a higher threshold they agree on the sparse rows and
below it the port's output is dense attention (transformers with index_topk >= the length).

Bounds, as measured here: in float32 the outputs are bit-equal to transformers' eager attention
(same selection, same sums in the same order); prefill split into chunks and decode steps is
within 2e-6 of the one-shot run (other matmul shapes). In bf16 the selection is the same and
the outputs within 2**-7 of the largest output magnitude (about two bf16 ulps): transformers
scales the logits and adds the mask in bf16 before its float32 softmax, the port computes the
logits in float32 first.
"""

from __future__ import annotations

import pytest
import torch

from glm5_hpu.dsa import DENSE_UNTIL_KEYS, DsaAttention, DsaCache, DsaIndexer, rope_cos_sin, select
from glm5_hpu.switches import read_switches

T = 48
TOPK = 8
ATOL = 2e-6


def _cfg(index_topk=TOPK, indexer_types=None):
    from transformers import GlmMoeDsaConfig

    cfg = GlmMoeDsaConfig(
        vocab_size=64,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        index_topk=index_topk,
        index_head_dim=32,
        index_n_heads=8,
        num_hidden_layers=2,
        first_k_dense_replace=2,
        max_position_embeddings=256,
        indexer_types=indexer_types or ["full", "full"],
    )
    cfg._attn_implementation = "eager"
    return cfg


def _layer(cfg, layer=0, seed=0):
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaAttention

    torch.manual_seed(seed)
    attn = GlmMoeDsaAttention(cfg, layer).eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("norm.bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.15)  # peaked attention, so the selected keys matter
    return attn


def _inputs(cfg, b=2, seed=1):
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaRotaryEmbedding

    torch.manual_seed(seed)
    x = torch.randn(b, T, cfg.hidden_size)
    pos = torch.arange(T)[None].expand(b, T)
    cos_sin = GlmMoeDsaRotaryEmbedding(cfg)(x, pos)
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None].expand(b, 1, T, T)
    return x, pos, cos_sin, mask


def _ours(attn, cfg, x, *, sparse=True, threshold=TOPK, layer=0):
    ours = DsaAttention(cfg, attn.state_dict(), layer, sparse=sparse, threshold=threshold)
    outs, sels = [], []
    for b in range(x.shape[0]):
        o, a = ours.forward(x[b], torch.arange(T), DsaCache())
        outs.append(o)
        sels.append(a)
    return torch.stack(outs), torch.stack(sels)


def test_rope_is_transformers():
    cfg = _cfg()
    x, pos, (cos, sin), _ = _inputs(cfg)
    c, s = rope_cos_sin(cfg, torch.arange(T), torch.float32)
    assert torch.equal(c, cos[0]) and torch.equal(s, sin[0])


def test_the_indexer_selects_what_transformers_selects():
    cfg = _cfg()
    attn = _layer(cfg)
    x, pos, cos_sin, mask = _inputs(cfg)
    with torch.no_grad():
        q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
        want = attn.indexer(x, q_resid, cos_sin, mask[:, 0], pos)  # [B, T, TOPK] int32
        idx = DsaIndexer(
            cfg, {k.removeprefix("indexer."): v for k, v in attn.state_dict().items() if k.startswith("indexer.")}
        )
        cos, sin = rope_cos_sin(cfg, torch.arange(T), torch.float32)
        for b in range(x.shape[0]):
            scores = idx.scores(x[b], q_resid[b], cos, sin, idx.keys(x[b], cos, sin))
            allowed = select(scores, torch.arange(T), TOPK, threshold=TOPK, sparse=True)
            for p in range(T):
                got = set(allowed[p].nonzero().flatten().tolist())
                theirs = set(want[b, p].tolist())
                if p + 1 > TOPK:  # sparse rows: the same top-k keys
                    assert got == theirs, (b, p)
                    assert len(got) == TOPK
                else:  # fewer visible keys than index_topk: every visible key, in both
                    assert got == set(range(p + 1)) and got <= theirs


def test_attention_equals_transformers_with_the_threshold_at_index_topk():
    cfg = _cfg()
    attn = _layer(cfg)
    x, pos, cos_sin, mask = _inputs(cfg)
    with torch.no_grad():
        want, _, _ = attn(x, cos_sin, mask, position_ids=pos)
        got, allowed = _ours(attn, cfg, x)
        dense, _ = _ours(attn, cfg, x, sparse=False)
    assert torch.equal(got, want)
    assert int(allowed[:, -1].sum(-1).max()) == TOPK
    # the selection matters here: dense differs from transformers by far more than the bound
    assert float((dense - want).abs().max()) > 100 * ATOL


def test_bf16_selects_the_same_keys_and_stays_within_two_ulps():
    cfg = _cfg()
    attn = _layer(cfg).to(torch.bfloat16)
    attn.indexer.weights_proj.float()  # the release keeps it in float32
    x, pos, (cos, sin), _ = _inputs(cfg)
    x, cos_sin = x.bfloat16(), (cos.bfloat16(), sin.bfloat16())
    mask = torch.full((T, T), torch.finfo(torch.bfloat16).min).triu(1)[None, None].expand(2, 1, T, T).bfloat16()
    with torch.no_grad():
        want, _, topk = attn(x, cos_sin, mask, position_ids=pos)
        got, allowed = _ours(attn, cfg, x)
    theirs = torch.zeros(2, T, T, dtype=torch.bool).scatter_(-1, topk.long(), True)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(theirs[:, TOPK:] & visible[TOPK:], allowed[:, TOPK:])
    assert got.dtype == torch.bfloat16
    assert float((got.float() - want.float()).abs().max()) <= 2**-7 * float(want.float().abs().max())


def test_below_the_threshold_attention_is_dense_and_above_it_sparse():
    threshold = 24
    cfg = _cfg()
    attn = _layer(cfg)
    x, pos, cos_sin, mask = _inputs(cfg)
    with torch.no_grad():
        sparse_ref, _, _ = attn(x, cos_sin, mask, position_ids=pos)
        dense_cfg = _cfg(index_topk=T)  # transformers selects every key: dense attention
        dense_attn = _layer(dense_cfg)
        dense_attn.load_state_dict(attn.state_dict())
        dense_ref, _, _ = dense_attn(x, cos_sin, mask, position_ids=pos)
        got, allowed = _ours(attn, cfg, x, threshold=threshold)
    n_keys = torch.arange(T) + 1
    below, above = n_keys <= threshold, n_keys > threshold
    assert torch.equal(got[:, below], dense_ref[:, below])
    assert torch.equal(got[:, above], sparse_ref[:, above])
    assert torch.equal(allowed[:, below].sum(-1), n_keys[below].expand(2, -1))
    assert bool((allowed[:, above].sum(-1) == TOPK).all())
    assert float((dense_ref[:, above] - sparse_ref[:, above]).abs().max()) > 100 * ATOL


@pytest.mark.parametrize("value, dense", [("0", True), ("off", True), ("1", False), ("", False)])
def test_glm_dsa_sparse_off_is_dense_attention_at_every_length(value, dense):
    cfg = _cfg()
    attn = _layer(cfg)
    x, pos, cos_sin, mask = _inputs(cfg)
    sparse = read_switches({"GLM_DSA_SPARSE": value}).dsa_sparse
    with torch.no_grad():
        dense_cfg = _cfg(index_topk=T)
        dense_attn = _layer(dense_cfg)
        dense_attn.load_state_dict(attn.state_dict())
        dense_ref, _, _ = dense_attn(x, cos_sin, mask, position_ids=pos)
        got, _ = _ours(attn, cfg, x, sparse=sparse)
    assert torch.equal(got, dense_ref) is dense
    assert (float((got - dense_ref).abs().max()) > 100 * ATOL) is not dense


def test_prefill_in_chunks_then_decode_gives_the_one_shot_output():
    cfg = _cfg()
    attn = _layer(cfg)
    x, *_ = _inputs(cfg, b=1)
    ours = DsaAttention(cfg, attn.state_dict(), 0, sparse=True, threshold=20)
    with torch.no_grad():
        whole, _ = ours.forward(x[0], torch.arange(T), DsaCache())
        cache, parts = DsaCache(), []
        for a, b in [(0, 13), (13, 30)] + [(i, i + 1) for i in range(30, T)]:
            parts.append(ours.forward(x[0, a:b], torch.arange(a, b), cache)[0])
    assert cache.length == T
    assert float((torch.cat(parts) - whole).abs().max()) <= ATOL


def test_a_shared_indexer_layer_reuses_the_previous_selection():
    cfg = _cfg(indexer_types=["full", "shared"])
    full, shared = _layer(cfg, 0), _layer(cfg, 1, seed=3)
    assert shared.indexer is None
    x, pos, cos_sin, mask = _inputs(cfg)
    with torch.no_grad():
        _, _, topk = full(x, cos_sin, mask, position_ids=pos)
        want, _, _ = shared(x, cos_sin, mask, position_ids=pos, prev_topk_indices=topk)
        _, allowed = _ours(full, cfg, x)
        ours = DsaAttention(cfg, shared.state_dict(), 1, sparse=True, threshold=TOPK)
        got = torch.stack(
            [ours.forward(x[b], torch.arange(T), DsaCache(), prev_allowed=allowed[b])[0] for b in range(2)]
        )
        with pytest.raises(ValueError, match="needs the previous full layer's selection"):
            ours.forward(x[0], torch.arange(T), DsaCache())
    assert torch.equal(got, want)


def test_the_seeds_numbers():
    """32,768 keys or fewer: dense; from 32,769 keys: the 2,048 best-scored visible keys."""
    t = DENSE_UNTIL_KEYS + 200
    torch.manual_seed(0)
    scores = torch.rand(4, t)
    q_pos = torch.tensor([100, DENSE_UNTIL_KEYS - 1, DENSE_UNTIL_KEYS, t - 1])
    allowed = select(scores, q_pos, 2048, DENSE_UNTIL_KEYS, sparse=True)
    assert allowed.sum(-1).tolist() == [101, DENSE_UNTIL_KEYS, 2048, 2048]
    best = scores[3].topk(2048).indices
    assert bool(allowed[3, best].all())
    assert not bool(allowed[2, DENSE_UNTIL_KEYS + 1 :].any())  # never a key the query cannot see
    assert select(scores, q_pos, 2048, DENSE_UNTIL_KEYS, sparse=False).sum(-1).tolist() == [
        101,
        DENSE_UNTIL_KEYS,
        DENSE_UNTIL_KEYS + 1,
        t,
    ]


def test_positions_must_continue_the_cache():
    cfg = _cfg()
    ours = DsaAttention(cfg, _layer(cfg).state_dict(), 0, sparse=True)
    with pytest.raises(ValueError, match="positions start at 5; the cache holds 0 keys"):
        ours.forward(torch.zeros(2, cfg.hidden_size), torch.tensor([5, 6]), DsaCache())
