"""mxfp4-moe-non-gpt-oss: an MXFP4 checkpoint of a model other than gpt-oss (GLM-5.3 from the
glm-5-mxfp4 converter) gets vllm-gaudi's HPU MXFP4 MoE method, built from the per-expert
weights and scales vLLM's loader fills.

Real code throughout: vLLM's Mxfp4Config picks the MoE method for a layer as it does at load
time, vLLM's create_weights makes the parameters, the tree's HPU method builds its MoE op. Only
the Gaudi bridge is stubbed; the fused MXFP4 kernel itself runs on a card (the port's gate)."""

import pytest

E, H, M = 8, 64, 32  # experts, hidden, intermediate (both multiples of the 32-element block)


def moe_config(ep_size=1, ep_rank=0, num_experts=E):
    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType

    par = FusedMoEParallelConfig(
        tp_size=1,
        pcp_size=1,
        dp_size=1,
        ep_size=ep_size,
        tp_rank=0,
        pcp_rank=0,
        dp_rank=0,
        ep_rank=ep_rank,
        sp_size=1,
        use_ep=ep_size > 1,
        all2all_backend="naive",
        enable_eplb=False,
    )
    local = num_experts // ep_size
    return FusedMoEConfig(
        num_experts=num_experts,
        experts_per_token=2,
        hidden_dim=H,
        intermediate_size=M,
        num_local_experts=local,
        num_logical_experts=num_experts,
        activation=MoEActivation.SILU,
        device="cpu",
        routing_method=RoutingMethodType.DeepSeekV3,
        moe_parallel_config=par,
        in_dtype=torch.bfloat16,
    )


@pytest.fixture()
def mx(tree, monkeypatch):
    # The Gaudi software version vllm_gaudi's runtime config reads from the bridge (stubbed):
    # the profile's base, Gaudi software 1.24.1.
    monkeypatch.setenv("VLLM_BUILD", "1.24.1.0")
    from vllm_gaudi.extension import runtime

    if not runtime.RUNTIME_CONFIG:
        # Detection asks for the INC package of the Gaudi image (neural_compressor_pt) for
        # these two; they only matter with data parallelism, which these tests do not use.
        runtime.get_config(use_dispatch_fn=False, per_token_kv_scaling_support=False)
    import vllm_gaudi.ops.hpu_mxfp4 as hpu  # what vllm_gaudi's plugin imports at start-up
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.quantization import mxfp4

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):  # as while a model is built
        yield hpu, mxfp4


def packed_layer(method, ep_size=1, ep_rank=0):
    """A MoE layer with the parameters vLLM's create_weights makes, filled as the loader would
    fill them from the converter's per-expert keys (distinct bytes per expert and tensor)."""
    from types import SimpleNamespace

    import torch

    layer = torch.nn.Module()
    method.create_weights(layer, E // ep_size, H, M, torch.bfloat16, weight_loader=None)
    g = torch.Generator().manual_seed(ep_rank)
    for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
        p = getattr(layer, name)
        p.data.copy_(torch.randint(0, 256, p.shape, generator=g, dtype=torch.uint8))
    layer.local_num_experts = E // ep_size
    layer.global_num_experts = E
    layer.moe_config = SimpleNamespace(ep_rank=ep_rank, dp_size=1, is_sequence_parallel=False)
    return layer


@pytest.mark.red_raises("NotImplementedError")
def test_mxfp4_config_gives_an_hpu_moe_method_for_a_non_gpt_oss_model(mx):
    hpu, mxfp4 = mx
    method = mxfp4.Mxfp4Config()._make_moe_method(moe_config())
    assert isinstance(method, hpu.HPUGptOssMxfp4MoEMethod)  # the HPU kernel set-up
    assert method.weight_dtype == "mxfp4" and method.mxfp4_backend is None


@pytest.mark.red_raises("NotImplementedError")
def test_the_hpu_op_takes_each_experts_packed_weights_and_scales(mx):
    import torch

    hpu, mxfp4 = mx
    method = mxfp4.Mxfp4Config()._make_moe_method(moe_config())
    layer = packed_layer(method)
    # vLLM's own layout for this format: uint8 pairs along the input axis, one E8M0 per 32, no bias
    assert layer.w13_weight.shape == (E, 2 * M, H // 2) and layer.w13_weight_scale.shape == (E, 2 * M, H // 32)
    assert layer.w2_weight.shape == (E, H, M // 2) and layer.w2_weight_scale.shape == (E, H, M // 32)
    assert not hasattr(layer, "w13_bias")
    method.process_weights_after_loading(layer)
    op = layer.moe_op
    assert (op.experts_min, op.experts_max, op.has_bias, op.block_size) == (0, E - 1, False, 32)
    for e in range(E):
        assert torch.equal(op.w13_list[e].weight, layer.w13_weight[e]) and torch.equal(
            op.w13_list[e].scale, layer.w13_weight_scale[e]
        )
        assert torch.equal(op.w2_list[e].weight, layer.w2_weight[e]) and torch.equal(
            op.w2_list[e].scale, layer.w2_weight_scale[e]
        )


@pytest.mark.red_raises("NotImplementedError")
def test_expert_parallel_rank_holds_its_own_experts(mx):
    hpu, mxfp4 = mx
    method = mxfp4.Mxfp4Config()._make_moe_method(moe_config(ep_size=2, ep_rank=1))
    layer = packed_layer(method, ep_size=2, ep_rank=1)
    method.process_weights_after_loading(layer)
    assert (layer.moe_op.experts_min, layer.moe_op.experts_max) == (E // 2, E - 1)
    assert len(layer.moe_op.w13_list) == E // 2


def test_gpt_oss_keeps_its_own_hpu_method(mx):
    """The gpt-oss path the override was written for is unchanged."""
    hpu, mxfp4 = mx
    method = mxfp4.GptOssMxfp4Config()._make_moe_method(moe_config())
    assert type(method) is hpu.HPUGptOssMxfp4MoEMethod and method.weight_dtype == "gpt_oss_mxfp4"
