"""GLM-5.3's MoE layer as the port's MoE tests build it: transformers' GlmMoeDsaMoE config and
module with random weights of real-model scale, its reference routing, and the converter's keys for
the layer (the experts quantized by the converter's kernel, the reference given the same
dequantized experts)."""

from __future__ import annotations

import torch

from glm5_hpu.moe_mxfp4 import route
from glm5_mxfp4 import mxfp4


def moe_config(n_group=1, topk_group=1, experts=16, top_k=4, hidden=128, inter=64, impl="eager"):
    from transformers import GlmMoeDsaConfig

    cfg = GlmMoeDsaConfig(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        n_group=n_group,
        topk_group=topk_group,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        num_hidden_layers=2,
        first_k_dense_replace=1,
    )
    cfg._experts_implementation = impl
    return cfg


def reference_moe(cfg, dtype, seed=0, bias_scale=0.05):
    """transformers' GlmMoeDsaMoE with random weights of real-model scale and a nonzero bias."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaMoE

    torch.manual_seed(seed)
    moe = GlmMoeDsaMoE(cfg).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.02)
        moe.gate.weight.normal_(0.0, 0.2)  # routing far from ties
        moe.gate.e_score_correction_bias.copy_(torch.randn(cfg.n_routed_experts) * bias_scale)
    moe = moe.to(dtype)
    moe.gate.e_score_correction_bias.data = moe.gate.e_score_correction_bias.data.float()
    return moe


def reference_route(moe, x, top_k=4):
    """The reference routing of ``x`` through ``moe``'s gate (one group, normalised, scale 2.5)."""
    return route(
        x,
        moe.gate.weight.detach(),
        moe.gate.e_score_correction_bias,
        top_k=top_k,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )


def converted_layer(moe, prefix="model.layers.1.mlp"):
    """The converter's keys for this layer: routed experts quantized by its kernel (even mode),
    everything else as stored; and the reference module given the same dequantized experts."""
    out = {
        f"{prefix}.gate.weight": moe.gate.weight.data,
        f"{prefix}.gate.e_score_correction_bias": moe.gate.e_score_correction_bias.data,
    }
    for p in ("gate_proj", "up_proj", "down_proj"):
        out[f"{prefix}.shared_experts.{p}.weight"] = getattr(moe.shared_experts, p).weight.data
    gu, dn = moe.experts.gate_up_proj.data, moe.experts.down_proj.data
    inter = gu.shape[1] // 2
    for e in range(gu.shape[0]):
        for name, w in (("gate_proj", gu[e, :inter]), ("up_proj", gu[e, inter:]), ("down_proj", dn[e])):
            q, s = mxfp4.quantize(w.to(torch.bfloat16), "even")
            out[f"{prefix}.experts.{e}.{name}.weight"] = torch.from_numpy(q)
            out[f"{prefix}.experts.{e}.{name}.weight_scale"] = torch.from_numpy(s)
    with torch.no_grad():  # the reference holds the converter's own dequantization
        for e in range(gu.shape[0]):
            for name, rows in (("gate_proj", slice(0, inter)), ("up_proj", slice(inter, None))):
                k = f"{prefix}.experts.{e}.{name}"
                gu[e, rows] = torch.from_numpy(
                    mxfp4.dequantize(out[k + ".weight"].numpy(), out[k + ".weight_scale"].numpy())
                ).to(gu.dtype)
            k = f"{prefix}.experts.{e}.down_proj"
            dn[e] = torch.from_numpy(mxfp4.dequantize(out[k + ".weight"].numpy(), out[k + ".weight_scale"].numpy())).to(
                dn.dtype
            )
    return out
