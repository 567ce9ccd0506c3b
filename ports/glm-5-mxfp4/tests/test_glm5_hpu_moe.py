"""glm5_hpu.moe_mxfp4: the MXFP4 MoE reference path against the converter and transformers 5.23.0.

* the torch decode equals the converter's ``glm5_mxfp4.mxfp4.dequantize`` bit for bit, for every
  byte under every scale code;
* the routing equals transformers' GlmMoeDsaTopkRouter (ids and weights), groups or not;
* the layer, holding the converter's packed experts, equals transformers' GlmMoeDsaMoE given the
  same dequantized weights: exactly for transformers' own expert loop ("eager"), in bf16 and fp32,
  and within a stated bound for the grouped_mm kernel transformers picks for a whole model;
* read from a real conversion (the converter's command on a tiny checkpoint), the same.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from glm5_hpu import moe_mxfp4
from glm5_hpu.moe_mxfp4 import GlmMoeMxfp4, MxfpExperts, dequantize, route
from glm5_mxfp4 import mxfp4
from packtests import glm_moe_dsa_tiny
from packtests.mxfp4_moe import converted_layer, moe_config, reference_moe, reference_route


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.mark.filterwarnings("ignore:overflow encountered in ldexp")  # the converter's code 255 (NaN) path
def test_decode_is_the_converters_for_every_byte_under_every_scale_code():
    packed = np.tile(np.arange(256, dtype=np.uint8), (256, 1))  # every byte value, each row
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 512 // 32, axis=1)  # row r: scale code r
    want = torch.from_numpy(mxfp4.dequantize(packed, scales))
    got = dequantize(torch.from_numpy(packed), torch.from_numpy(scales))
    assert got.dtype == torch.float32 and got.shape == (256, 512)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan) and bool(nan[255].all()) and not bool(nan[:255].any())
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan])
    # code 0 is 2**-127 (not 0), as the converter reads it: byte 0x11 -> 0.5 * 2**-127 twice
    assert got[0, 2 * 0x11].item() == 2.0**-128
    # mixed scales per block, several leading axes, and the bf16 output (exact for real weights)
    rng = np.random.default_rng(0)
    p = rng.integers(0, 256, (3, 5, 64), dtype=np.uint8)
    s = rng.integers(100, 140, (3, 5, 4), dtype=np.uint8)
    ref = torch.from_numpy(mxfp4.dequantize(p, s))
    assert torch.equal(_bits(dequantize(torch.from_numpy(p), torch.from_numpy(s))), _bits(ref))
    bf = dequantize(torch.from_numpy(p), torch.from_numpy(s), torch.bfloat16)
    assert torch.equal(bf.float(), ref)


def test_decode_refuses_mismatched_or_wrong_dtype_inputs():
    with pytest.raises(ValueError, match=r"packed \(4, 16\) and scales \(4, 2\) do not match"):
        dequantize(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8))
    with pytest.raises(TypeError, match="must both be uint8"):
        dequantize(torch.zeros(4, 16, dtype=torch.int8), torch.zeros(4, 1, dtype=torch.uint8))


@pytest.mark.parametrize("groups", [(1, 1), (4, 2)])
def test_routing_is_transformers(groups):
    cfg = moe_config(*groups)
    moe = reference_moe(cfg, torch.bfloat16)
    x = torch.randn(37, cfg.hidden_size).bfloat16()
    _, want_w, want_ids = moe.gate(x)
    w, ids = route(
        x,
        moe.gate.weight,
        moe.gate.e_score_correction_bias,
        top_k=cfg.num_experts_per_tok,
        n_group=cfg.n_group,
        topk_group=cfg.topk_group,
        norm_topk_prob=cfg.norm_topk_prob,
        routed_scaling_factor=cfg.routed_scaling_factor,
    )
    assert torch.equal(ids, want_ids) and torch.equal(w, want_w) and w.dtype == torch.float32
    # the bias chose: without it the selection differs, yet the weights are unbiased scores
    w0, ids0 = route(
        x,
        moe.gate.weight,
        torch.zeros_like(moe.gate.e_score_correction_bias),
        top_k=cfg.num_experts_per_tok,
        n_group=cfg.n_group,
        topk_group=cfg.topk_group,
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
    )
    assert not torch.equal(ids0.sort(-1).values, ids.sort(-1).values)
    scores = torch.sigmoid(x.float() @ moe.gate.weight.float().t())
    assert torch.equal(w0, scores.gather(1, ids0))
    if cfg.n_group > 1:  # every token's experts lie in at most topk_group groups
        per_group = cfg.n_routed_experts // cfg.n_group
        assert max(len(set((r // per_group).tolist())) for r in ids) <= cfg.topk_group


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("groups", [(1, 1), (4, 2)])
def test_moe_layer_equals_transformers_given_the_same_dequantized_experts(dtype, groups):
    cfg = moe_config(*groups)
    moe = reference_moe(cfg, dtype)
    ckpt = converted_layer(moe)
    ours = GlmMoeMxfp4.from_checkpoint(cfg, ckpt, layer=1)
    x = torch.randn(2, 29, cfg.hidden_size).to(dtype)
    with torch.no_grad():
        want = moe(x)
        got = ours(x)
    assert got.dtype == dtype and torch.equal(got, want)
    # the experts are held packed: 4.25 bits a weight, nothing decoded ahead of time
    e = ours.experts
    assert e.w13.dtype == torch.uint8 and e.w13.shape == (16, 2 * cfg.moe_intermediate_size, cfg.hidden_size // 2)
    assert e.w2_scale.shape == (16, cfg.hidden_size, cfg.moe_intermediate_size // 32)


def test_grouped_mm_experts_agree_within_a_stated_bound():
    """A whole transformers model on CPU runs its experts with grouped_mm, not the eager loop:
    another GEMM, another summation order, so not bit-equal. Bound: fp32, max abs difference
    below 1e-6 of the output's max magnitude."""
    cfg = moe_config(impl="grouped_mm")
    moe = reference_moe(cfg, torch.float32)
    ours = GlmMoeMxfp4.from_checkpoint(cfg, converted_layer(moe), layer=1)
    x = torch.randn(64, cfg.hidden_size)
    with torch.no_grad():
        want, got = moe(x), ours(x)
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_experts_are_decoded_on_the_fly_only_when_a_token_reaches_them(monkeypatch):
    cfg = moe_config()
    moe = reference_moe(cfg, torch.bfloat16)
    ours = GlmMoeMxfp4.from_checkpoint(cfg, converted_layer(moe), layer=1)
    decoded = []
    real = moe_mxfp4.dequantize
    monkeypatch.setattr(
        moe_mxfp4, "dequantize", lambda p, s, d=torch.float32: decoded.append(tuple(p.shape)) or real(p, s, d)
    )
    x = torch.randn(1, cfg.hidden_size).bfloat16()
    ours(x)
    # one token: top_k experts, each decoded once (w13 and w2), one expert at a time
    assert len(decoded) == 2 * cfg.num_experts_per_tok
    assert set(decoded) == {
        (2 * cfg.moe_intermediate_size, cfg.hidden_size // 2),
        (cfg.hidden_size, cfg.moe_intermediate_size // 2),
    }


def test_an_expert_group_holds_only_its_experts_and_the_groups_sum_to_the_layer():
    """Expert parallelism: each rank loads its group of experts; the ranks' outputs (routed
    part) add up to the whole layer's."""
    cfg = moe_config()
    moe = reference_moe(cfg, torch.float32)
    ckpt = converted_layer(moe)
    x = torch.randn(40, cfg.hidden_size)
    w, ids = reference_route(moe, x)
    whole = MxfpExperts.from_checkpoint(ckpt, "model.layers.1.mlp", range(16)).forward(x, ids, w)
    parts = [
        MxfpExperts.from_checkpoint(
            {k: v for k, v in ckpt.items() if ".experts." not in k or int(k.split(".experts.")[1].split(".")[0]) in g},
            "model.layers.1.mlp",
            g,
        ).forward(x, ids, w)
        for g in (range(0, 8), range(8, 16))
    ]
    assert torch.allclose(parts[0] + parts[1], whole, rtol=0, atol=1e-6)
    assert not torch.equal(parts[0], torch.zeros_like(parts[0])) and not torch.equal(
        parts[1], torch.zeros_like(parts[1])
    )


def test_bad_checkpoints_name_the_key_and_the_expert():
    cfg = moe_config()
    ckpt = converted_layer(reference_moe(cfg, torch.bfloat16))
    del ckpt["model.layers.1.mlp.experts.5.up_proj.weight_scale"]
    with pytest.raises(
        KeyError,
        match=r"model.layers.1.mlp.experts.5.up_proj.weight / .weight_scale: not in the checkpoint \(expert 5\)",
    ):
        GlmMoeMxfp4.from_checkpoint(cfg, ckpt, layer=1)
    ckpt = converted_layer(reference_moe(cfg, torch.bfloat16))
    ckpt["model.layers.1.mlp.experts.3.down_proj.weight_scale"] = ckpt[
        "model.layers.1.mlp.experts.3.down_proj.weight_scale"
    ][:, :1]
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        GlmMoeMxfp4.from_checkpoint(cfg, ckpt, layer=1)
    ckpt = converted_layer(reference_moe(cfg, torch.bfloat16))
    ckpt["model.layers.1.mlp.gate.e_score_correction_bias"] = ckpt[
        "model.layers.1.mlp.gate.e_score_correction_bias"
    ].bfloat16()
    with pytest.raises(TypeError, match="e_score_correction_bias is torch.bfloat16; the release keeps it in float32"):
        GlmMoeMxfp4.from_checkpoint(cfg, ckpt, layer=1)
    with pytest.raises(ValueError, match=r"w13: torch.float32 \(2, 128, 64\), expected uint8 \(2, 128, 64\)"):
        MxfpExperts(
            [0, 1],
            torch.zeros(2, 128, 64),
            torch.zeros(2, 128, 4, dtype=torch.uint8),
            torch.zeros(2, 128, 32, dtype=torch.uint8),
            torch.zeros(2, 128, 2, dtype=torch.uint8),
        )


def test_from_a_real_conversion(tmp_path):
    """The converter's command on a tiny checkpoint; layer 1's MoE read from its output files
    equals transformers' MoE of the model whose experts hold the converter's dequantization."""
    from safetensors import safe_open
    from transformers import GlmMoeDsaForCausalLM

    from glm5_mxfp4 import convert

    src = glm_moe_dsa_tiny.make(str(tmp_path / "src"))
    dst = tmp_path / "dst"
    assert convert.main([src, str(dst), "--quiet"]) == 0
    index = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]

    def get(key):
        with safe_open(str(dst / index[key]), "pt") as f:
            return f.get_tensor(key)

    cfg = json.loads((dst / "config.json").read_text())
    model = GlmMoeDsaForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    model.config._experts_implementation = "eager"
    ref = model.model.layers[1].mlp
    with torch.no_grad():
        for e in range(ref.experts.num_experts):
            w13, w2 = MxfpExperts.from_checkpoint(get, "model.layers.1.mlp", [e]).weights(e, torch.float32)
            ref.experts.gate_up_proj[e] = w13.bfloat16()
            ref.experts.down_proj[e] = w2.bfloat16()
        ours = GlmMoeMxfp4.from_checkpoint(model.config, get, layer=1)
        x = torch.randn(3, 11, model.config.hidden_size).bfloat16()
        assert torch.equal(ours(x), ref(x))
    assert cfg["quantization_config"]["quant_method"] == "mxfp4"
    # the decoded experts are the converter's dequantization of its own output
    k = "model.layers.1.mlp.experts.2.down_proj"
    want = mxfp4.dequantize(get(k + ".weight").numpy(), get(k + ".weight_scale").numpy())
    assert torch.equal(
        MxfpExperts.from_checkpoint(get, "model.layers.1.mlp", [2]).weights(2, torch.float32)[1], torch.from_numpy(want)
    )
