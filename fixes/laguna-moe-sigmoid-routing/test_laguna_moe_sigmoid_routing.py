"""Ungrouped MoE routing on HPU honours the layer's scoring function, score-correction bias
and renormalize flag (Laguna: sigmoid + bias), and the routing of every other layer is
unchanged bit for bit (grouped routing such as GLM-5.3-Flash's, and plain softmax).

The real apply_monolithic / forward_oot of the HPU MoE methods run on CPU; only the fused
HPU expert kernel (layer.moe_op, torch.ops.hpu.mixture_of_experts) is replaced by a
recorder of the routing it receives. The layer is the set of routing fields vLLM's
RoutedExperts carries (routed_experts.py)."""

from types import SimpleNamespace

import pytest
import torch

E, K, T, H = 16, 4, 12, 8  # experts, top-k, tokens, hidden


class RecordingMoEOp:
    """Stands in for the HPU fused-MoE kernel: remembers the routing it was given."""

    def __call__(self, x, topk_ids, topk_weights, **kwargs):
        self.topk_ids, self.topk_weights = topk_ids.clone(), topk_weights.clone()
        return torch.zeros_like(x)


def _layer(**routing):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    fields = dict(use_grouped_topk=False, custom_routing_function=None, top_k=K, scoring_func="softmax",
                  e_score_correction_bias=None, renormalize=True, routed_scaling_factor=1.0, topk_group=None,
                  num_expert_group=None)
    fields.update(routing)
    return SimpleNamespace(**fields,
                           moe_config=SimpleNamespace(dp_size=1, is_sequence_parallel=False, num_logical_experts=E),
                           activation=MoEActivation.SILU, moe_op=RecordingMoEOp())


def _methods():
    from vllm_gaudi.ops.hpu_compressed_tensors import HPUCompressedTensorsW8A8Fp8MoEMethod
    from vllm_gaudi.ops.hpu_fp8 import HPUFp8MoEMethod
    from vllm_gaudi.ops.hpu_fused_moe import HPUUnquantizedFusedMoEMethod
    return {
        "unquantized.apply_monolithic": (HPUUnquantizedFusedMoEMethod, "apply_monolithic"),
        "unquantized.forward_oot": (HPUUnquantizedFusedMoEMethod, "forward_oot"),
        "fp8.apply_monolithic": (HPUFp8MoEMethod, "apply_monolithic"),
        "compressed_w8a8_fp8.apply_monolithic": (HPUCompressedTensorsW8A8Fp8MoEMethod, "apply_monolithic"),
    }


METHODS = ["unquantized.apply_monolithic", "unquantized.forward_oot", "fp8.apply_monolithic",
           "compressed_w8a8_fp8.apply_monolithic"]


def _route(method_name, layer, logits):
    """Run the real HPU method; return (ids, weights) per token, ordered by expert id."""
    cls, fn = _methods()[method_name]
    method = object.__new__(cls)  # the real class; only the fields the forward reads are set
    method.model_type = None
    method.has_moe_quant_config = False
    method.use_dispatch_fn = False
    x = torch.randn(logits.shape[0], H, dtype=torch.float32)
    getattr(method, fn)(layer, x, logits)
    ids, weights = layer.moe_op.topk_ids, layer.moe_op.topk_weights
    assert ids.dtype == torch.int64 and weights.dtype == x.dtype
    order = ids.argsort(dim=-1)
    return ids.gather(1, order), weights.gather(1, order)


def _reference(logits, *, scoring, bias=None, renormalize=True, scale=1.0):
    """vLLM's ungrouped routing (FusedTopKRouter / FusedTopKBiasRouter), in float64."""
    z = logits.double()
    scores = z.sigmoid() if scoring == "sigmoid" else z.softmax(dim=-1)
    choice = scores if bias is None else scores + bias.double()
    top = choice.topk(K + 1, dim=-1)
    # No near-ties at the k-th place, so the float32 selection must agree with float64.
    assert (top.values[:, K - 1] - top.values[:, K]).min() > 1e-4
    ids = top.indices[:, :K].sort(dim=-1).values
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights * (scale if bias is not None else 1.0)


def _logits(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, E, generator=g, dtype=torch.float32) * 2.0


def _laguna_bias():
    # Load-balancing bias of the size that changes which experts win (checked below).
    return torch.linspace(-0.6, 0.6, E, dtype=torch.float32).roll(5)


@pytest.mark.parametrize("method_name", METHODS)
def test_sigmoid_with_correction_bias_matches_float64_reference(tree, method_name):
    logits, bias = _logits(0), _laguna_bias()
    # routed_scaling_factor is 1.0 on Laguna's experts (apply_routed_scale_to_output=True).
    layer = _layer(scoring_func="sigmoid", e_score_correction_bias=bias, renormalize=True)
    ids, weights = _route(method_name, layer, logits)
    ref_ids, ref_weights = _reference(logits, scoring="sigmoid", bias=bias)
    assert not torch.equal(ref_ids, _reference(logits, scoring="sigmoid")[0]), "bias must change the routing"
    assert torch.equal(ids, ref_ids), "experts chosen differ from sigmoid(logits) + bias top-k"
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method_name", METHODS)
def test_bias_router_applies_routed_scaling_factor(tree, method_name):
    logits, bias = _logits(1), _laguna_bias()
    layer = _layer(scoring_func="sigmoid", e_score_correction_bias=bias, renormalize=True,
                   routed_scaling_factor=2.5)
    ids, weights = _route(method_name, layer, logits)
    ref_ids, ref_weights = _reference(logits, scoring="sigmoid", bias=bias, scale=2.5)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
@pytest.mark.parametrize("method_name", METHODS)
def test_renormalize_false_keeps_raw_scores(tree, method_name, scoring):
    logits = _logits(2)
    layer = _layer(scoring_func=scoring, renormalize=False)
    ids, weights = _route(method_name, layer, logits)
    ref_ids, ref_weights = _reference(logits, scoring=scoring, renormalize=False)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method_name", METHODS)
def test_grouped_routing_is_bit_identical(tree, release, method_name, monkeypatch):
    """GLM-5.3-Flash-style grouped routing (sigmoid, bias, one group, scaling) is exactly
    what vLLM's grouped_topk returns, before and after the fix."""
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.cpu_fused_moe import grouped_topk

    if release == "v0.30.0":
        # vllm-gaudi main's select_experts_from_routed imports select_experts from experts.cpu_moe,
        # which vLLM 0.27.0 (the vLLM this base imports with) keeps in cpu_fused_moe: hand it
        # vLLM's own function there, so the grouped branch runs as on the vLLM main was written for.
        from vllm.model_executor.layers.fused_moe.experts import cpu_moe

        monkeypatch.setattr(cpu_moe, "select_experts", cpu_fused_moe.select_experts, raising=False)

    logits, bias = _logits(3), _laguna_bias()
    layer = _layer(use_grouped_topk=True, scoring_func="sigmoid", e_score_correction_bias=bias, renormalize=True,
                   routed_scaling_factor=2.5, num_expert_group=1, topk_group=1)
    _route(method_name, layer, logits)
    want_w, want_ids = grouped_topk(hidden_states=torch.zeros(T, H), gating_output=logits, topk=K, renormalize=True,
                                    num_expert_group=1, topk_group=1, scoring_func="sigmoid",
                                    routed_scaling_factor=2.5, e_score_correction_bias=bias)
    assert torch.equal(layer.moe_op.topk_ids, want_ids.to(torch.int64))
    assert torch.equal(layer.moe_op.topk_weights, want_w.to(torch.float32))


@pytest.mark.parametrize("method_name", METHODS)
def test_plain_softmax_routing_is_bit_identical(tree, method_name):
    """softmax -> top-k -> renormalise (Mixtral, Qwen3-MoE ...) keeps its exact bits."""
    logits = _logits(4)
    layer = _layer()
    _route(method_name, layer, logits)
    w = torch.nn.functional.softmax(logits, dim=1, dtype=torch.float32)
    w, ids = torch.topk(w, K, dim=-1)
    w /= w.sum(dim=-1, keepdim=True)
    assert torch.equal(layer.moe_op.topk_ids, ids)
    assert torch.equal(layer.moe_op.topk_weights, w)
