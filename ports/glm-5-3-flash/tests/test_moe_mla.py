"""MoE routing and NoPE MLA / DSA indexer against the reference layers."""

import pytest
import torch
from transformers.models.glm5_next import modeling_glm5_next as ref

from glm5_next_hpu.layers.mla import MLAAttention, dense_equals_sparse
from glm5_next_hpu.layers.moe import MoE
from packtests.flash_reference import build_reference, max_abs


def _moe_pair(cfg):
    torch.manual_seed(0)
    r = ref.Glm5NextTextMoE(cfg)
    with torch.no_grad():
        for p in r.parameters():
            p.normal_(0, 0.3)
        r.gate.e_score_correction_bias.normal_(0, 0.3)
    port = MoE(cfg)
    with torch.no_grad():
        port.gate.weight.copy_(r.gate.weight)
        port.gate.e_score_correction_bias.copy_(r.gate.e_score_correction_bias)
        port.experts.w13_weight.copy_(r.experts.gate_up_proj)
        port.experts.w2_weight.copy_(r.experts.down_proj)
        port.shared_experts.load_state_dict(r.shared_experts.state_dict())
    return r, port


@pytest.fixture(scope="module")
def text_cfg():
    _, cfg = build_reference()
    return cfg.text_config


@pytest.mark.parametrize("magnitude", [1.0, 40.0])  # x40: the swiglu clamp binds
def test_moe_matches_reference_including_clamp(text_cfg, magnitude):
    r, port = _moe_pair(text_cfg)
    x = magnitude * torch.randn(2, 9, text_cfg.hidden_size)
    with torch.no_grad():
        assert max_abs(port(x), r(x)) <= 1e-5 * float(r(x).abs().max())


def test_router_uses_bias_for_selection_only_and_scales_normalised_weights(text_cfg):
    r, port = _moe_pair(text_cfg)
    x = torch.randn(30, text_cfg.hidden_size)
    with torch.no_grad():
        _, w_ref, ids_ref = r.gate(x)
        w, ids = port.gate(x)
        scores = torch.sigmoid(x.float() @ port.gate.weight.float().T)
    assert torch.equal(ids.sort(-1).values, ids_ref.sort(-1).values)
    assert max_abs(w.gather(1, ids.argsort(-1)), w_ref.gather(1, ids_ref.argsort(-1))) < 1e-6
    unbiased = scores.gather(1, ids)
    assert max_abs(w, 2.5 * unbiased / unbiased.sum(-1, keepdim=True)) < 1e-6
    assert max_abs(w.sum(-1), torch.full((30,), 2.5)) < 1e-5
    # The bias changes which experts win on some tokens (else this test proves nothing).
    assert not torch.equal(scores.topk(2).indices.sort(-1).values, ids.sort(-1).values)


def test_moe_without_clamp_would_fail_where_port_passes(text_cfg):
    r, port = _moe_pair(text_cfg)
    x = 40 * torch.randn(2, 9, text_cfg.hidden_size)
    port.experts.limit = port.shared_experts.limit = float("inf")
    with torch.no_grad():
        assert max_abs(port(x), r(x)) > 1e-2 * float(r(x).abs().max())


def _mla_pair(index_topk, kpool=4, seed=0):
    ref_model, cfg = build_reference(seed=seed, index_topk=index_topk)
    tc = cfg.text_config
    r = ref_model.model.language_model.layers[1].self_attn
    port = MLAAttention(tc, 1)
    port.load_state_dict(r.state_dict())
    return r, port, tc


def _ref_mla(r, x, mask):
    with torch.no_grad():
        return r(x, attention_mask=mask, past_key_values=None)[0]


def test_dense_mla_equals_reference_dsa_up_to_topk_plus_tail():
    r, port, tc = _mla_pair(index_topk=32)
    limit = 32 + 4 - 1
    assert dense_equals_sparse(limit, 32, 4) and not dense_equals_sparse(limit + 1, 32, 4)
    x = torch.randn(2, limit, tc.hidden_size)
    mask = torch.ones(2, limit, dtype=torch.bool)
    with torch.no_grad():
        assert max_abs(port(x, mask, None), _ref_mla(r, x, mask)) < 1e-5


def test_dense_mla_is_only_an_approximation_beyond_the_limit_and_port_indexer_is_exact():
    r, port, tc = _mla_pair(index_topk=32)
    torch.manual_seed(1)
    x = torch.randn(2, 120, tc.hidden_size)
    mask = torch.ones(2, 120, dtype=torch.bool)
    mask[1, :9] = False
    expected = _ref_mla(r, x, mask)
    with torch.no_grad():
        dense = port(x, mask, None)
        port.use_indexer = True
        sparse = port(x, mask, None)
    real = mask
    approx = max_abs(dense[real], expected[real])
    assert approx > 1e-4  # measured approximation of dense attention past 35 keys
    assert max_abs(sparse[real], expected[real]) < 1e-5


def test_port_indexer_selects_the_same_keys_as_reference():
    r, port, tc = _mla_pair(index_topk=32, seed=3)
    torch.manual_seed(2)
    x = torch.randn(2, 100, tc.hidden_size)
    mask = torch.ones(2, 100, dtype=torch.bool)
    mask[0, :7] = False
    with torch.no_grad():
        q_resid = r.q_a_layernorm(r.q_a_proj(x))
        idx = r.indexer(hidden_states=x, q_resid=q_resid, attention_mask=mask, past_key_values=None)
        valid = idx.ge(0)
        expected = (
            torch.zeros(2, 100, 100, dtype=torch.int32).scatter_add_(2, idx.clamp(min=0).long(), valid.int()).ne(0)
        )
        got = port.indexer.selection_mask(x, q_resid, mask)
    assert torch.equal(got[mask], expected[mask])
    assert int(got[mask].sum(-1).max()) <= 32 + 3  # index_topk + kpool - 1


def test_dense_equals_sparse_rule_at_real_sizes():
    assert dense_equals_sparse(2048 + 15, 2048, 16)
    assert not dense_equals_sparse(2048 + 16, 2048, 16)
    assert dense_equals_sparse(2048 + 3, 2048, 4) and not dense_equals_sparse(2052, 2048, 4)
