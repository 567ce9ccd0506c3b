"""glm5_hpu.placement: the GLM_MOE_PLACEMENT file is a checked permutation per MoE layer, and a
placement changes where experts are stored, never the MoE output."""

from __future__ import annotations

import json

import pytest
import torch

from glm5_hpu import placement
from glm5_hpu.moe_mxfp4 import GlmMoeMxfp4, MxfpExperts
from glm5_hpu.placement import FORMAT, PlacementError
from glm5_hpu.switches import read_switches
from packtests.mxfp4_moe import converted_layer, moe_config, reference_moe, reference_route


def _model_cfg(n_experts=16, mtp=1):
    """4 layers: 0 dense, 1..3 MoE, plus MTP layer 4."""
    from transformers import GlmMoeDsaConfig

    cfg = GlmMoeDsaConfig(num_hidden_layers=4, first_k_dense_replace=1, n_routed_experts=n_experts)
    cfg.num_nextn_predict_layers = mtp
    return cfg


def _write(tmp_path, body, name="placement.json"):
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def _valid(n=16, layers=(1, 2, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "format": FORMAT,
        "n_routed_experts": n,
        "layers": {str(layer): torch.randperm(n, generator=g).tolist() for layer in layers},
    }


def test_moe_layers_are_the_sparse_layers_and_the_mtp_layer():
    assert placement.moe_layers(_model_cfg()) == [1, 2, 3, 4]


def test_a_valid_file_gives_each_layers_order_and_its_expert_groups(tmp_path):
    body = _valid()
    p = placement.load(_write(tmp_path, body), _model_cfg())
    assert p.order(1) == body["layers"]["1"] and p.order(4) == body["layers"]["4"]
    assert p.order(3) == list(range(16))  # not listed: the checkpoint's order
    groups = [p.group(2, 4, g) for g in range(4)]
    assert [e for grp in groups for e in grp] == body["layers"]["2"] and all(len(grp) == 4 for grp in groups)
    assert placement.load(_write(tmp_path, placement.dump(p), "again.json"), _model_cfg()).layers == p.layers
    with pytest.raises(PlacementError, match="16 experts do not split into 3 equal expert groups"):
        p.group(1, 3, 0)


def test_the_switch_names_the_file_and_unset_is_the_checkpoints_order(tmp_path):
    cfg = _model_cfg()
    path = _write(tmp_path, _valid())
    assert placement.from_switch(read_switches({}).moe_placement, cfg) == placement.identity(cfg)
    assert placement.from_switch(read_switches({"GLM_MOE_PLACEMENT": "none"}).moe_placement, cfg).layers == {}
    p = placement.from_switch(read_switches({"GLM_MOE_PLACEMENT": str(path)}).moe_placement, cfg)
    assert p.source == str(path) and set(p.layers) == {1, 2, 4}


def _set(layer, slot=None, value=None, order=None):
    def change(body):
        if order is not None:
            body["layers"][layer] = order
        else:
            body["layers"][layer][slot] = value

    return change


CASES = {
    "duplicate": (
        lambda b: b["layers"]["2"].__setitem__(5, b["layers"]["2"][9]),
        r"layer 2: expert (\d+) appears twice \(slots \d+ and \d+\)",
    ),
    "out of range": (_set("1", 3, 16), r"layer 1: slot 3: expert 16 is out of range 0..15"),
    "negative": (_set("1", 0, -1), r"layer 1: slot 0: expert -1 is out of range 0..15"),
    "not an id": (_set("4", 7, "3"), r"layer 4: slot 7: '3' is not an expert id"),
    "bool": (_set("4", 7, True), r"layer 4: slot 7: True is not an expert id"),
    "short": (_set("1", order=list(range(14))), r"layer 1: 14 experts, expected 16; missing expert\(s\) 14..15"),
    "not a list": (_set("1", order={"0": 1}), r"layer 1: the expert order must be a list of 16 expert ids"),
    "dense layer": (_set("0", order=list(range(16))), r"layer 0: a dense layer \(MoE layers: 1..4\)"),
    "no such layer": (_set("9", order=list(range(16))), r"layer 9: not a layer of this model \(MoE layers: 1..4\)"),
    "bad layer id": (
        _set("01", order=list(range(16))),
        r"layer '01': a layer id is a decimal number without leading zeros",
    ),
    "expert count": (
        lambda b: b.update(n_routed_experts=256),
        r"n_routed_experts is 256; the model has 16 routed experts",
    ),
    "format": (lambda b: b.update(format="other/1"), r"format is 'other/1', expected 'glm5-moe-placement/1'"),
    "unknown key": (lambda b: b.update(layer={}), r"unknown key\(s\) layer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_file_is_refused_naming_the_file_the_layer_and_the_expert(tmp_path, case):
    change, message = CASES[case]
    body = _valid()
    change(body)
    path = _write(tmp_path, body)
    with pytest.raises(PlacementError, match=message) as exc:
        placement.load(path, _model_cfg())
    assert str(exc.value).startswith(f"{path}: ")
    if case == "duplicate":
        e = body["layers"]["2"][9]
        assert f"expert {e} appears twice (slots 5 and 9)" in str(exc.value)


def test_unreadable_or_not_json(tmp_path):
    with pytest.raises(PlacementError, match=r"nope.json: cannot read the placement file: No such file or directory"):
        placement.load(tmp_path / "nope.json", _model_cfg())
    with pytest.raises(PlacementError, match=r"bad.json: not JSON"):
        placement.load(_write(tmp_path, "{'layers': ", "bad.json"), _model_cfg())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_random_placement_permutes_storage_and_leaves_the_output_identical(tmp_path, dtype, seed):
    """A wrong file is slower, never wrong: any permutation, the same bits out."""
    cfg = moe_config(n_group=4, topk_group=2)
    cfg.num_nextn_predict_layers = 0
    moe = reference_moe(cfg, dtype)
    ckpt = converted_layer(moe)
    p = placement.load(_write(tmp_path, _valid(16, layers=(1,), seed=seed)), cfg)
    order = p.order(1)
    assert order != list(range(16))
    plain = GlmMoeMxfp4.from_checkpoint(cfg, ckpt, layer=1)
    placed = GlmMoeMxfp4.from_checkpoint(cfg, ckpt, layer=1, experts=order)
    # storage really differs: slot s holds expert order[s]
    assert not torch.equal(placed.experts.w13, plain.experts.w13)
    assert torch.equal(placed.experts.w13, plain.experts.w13[order])
    assert torch.equal(placed.experts.w2_scale, plain.experts.w2_scale[order])
    x = torch.randn(3, 21, cfg.hidden_size).to(dtype)
    with torch.no_grad():
        assert torch.equal(placed(x), plain(x))


def test_eight_cards_at_glm_moe_tp_2_hold_a_quarter_of_the_experts_each_half_wide(tmp_path):
    """The recipe's layout, scaled down: 8 cards, GLM_MOE_TP=2, so 4 expert groups of 2 cards; a
    card holds its group's experts (a placement's slice) with half the intermediate dimension.
    The 8 cards' routed outputs add up to the whole layer's (fp32; another summation order, so
    within 1e-6 of the largest magnitude, not bit-equal)."""
    cfg = moe_config()
    cfg.num_nextn_predict_layers = 0
    moe = reference_moe(cfg, torch.float32)
    ckpt = converted_layer(moe)
    p = placement.load(_write(tmp_path, _valid(16, layers=(1,), seed=5)), cfg)
    x = torch.randn(40, cfg.hidden_size)
    w, ids = reference_route(moe, x)
    prefix = "model.layers.1.mlp"
    whole = MxfpExperts.from_checkpoint(ckpt, prefix, range(16)).forward(x, ids, w)
    total, held = torch.zeros_like(whole), []
    moe_tp = read_switches({"GLM_MOE_TP": "2"}).moe_tp
    for rank in range(8):
        group, n_groups, tp_rank = placement.expert_group(rank, 8, moe_tp)
        card = MxfpExperts.from_checkpoint(ckpt, prefix, p.group(1, n_groups, group), tp=(tp_rank, moe_tp))
        assert card.w13.shape == (4, 2 * 32, cfg.hidden_size // 2) and card.w2.shape == (4, cfg.hidden_size, 16)
        held += card.experts
        total += card.forward(x, ids, w)
    assert sorted(held) == sorted(2 * list(range(16)))  # every expert on exactly its group's 2 cards
    assert float((total - whole).abs().max()) <= 1e-6 * float(whole.abs().max())
    with pytest.raises(PlacementError, match=r"GLM_MOE_TP=3 does not divide the 8 cards"):
        placement.expert_group(0, 8, 3)
    with pytest.raises(
        ValueError,
        match=r"experts.0: intermediate size 64 does not split into 4 parts of whole 32-blocks \(GLM_MOE_TP=4\)",
    ):
        MxfpExperts.from_checkpoint(ckpt, prefix, [0], tp=(0, 4))
