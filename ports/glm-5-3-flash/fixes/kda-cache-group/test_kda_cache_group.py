"""maybe_set_mamba_kv_cache_groups_ids on a hybrid model that is not one of vllm-gaudi's four
listed architectures, with its linear-attention (KDA) layer registered as `...self_attn`, as the
GLM-5.3-Flash port does. With the hybrid cache (auto-enabled for linear_attention models) the
layer picks its state indices by cache_group_idx, so it must be set to the layer's own group."""

import pytest
import torch
import torch.nn as nn


@pytest.fixture()
def runner(tree):
    from vllm_gaudi.v1.worker import hpu_model_runner

    return hpu_model_runner


def build(runner_mod):
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec, MLAAttentionSpec

    class KDA(MambaBase, nn.Module):  # the shape of the port's KDA layer: state in two tensors
        def __init__(self):
            nn.Module.__init__(self)
            self.A_log = nn.Parameter(torch.zeros(1, 1, 2, 1))
            self.cache_group_idx = None  # set by the model runner for the hybrid cache

        def get_state_shape(self):
            return ((6, 3), (2, 4, 4))

        def get_state_dtype(self):
            return (torch.bfloat16, torch.float32)

        @property
        def mamba_type(self):
            return "linear_attention"

    class Layer(nn.Module):
        def __init__(self, kda: bool):
            super().__init__()
            self.self_attn = KDA() if kda else nn.Linear(2, 2)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Cfg", (), {"architectures": ["Glm5NextForConditionalGeneration"]})()
            self.model = nn.Module()
            self.model.layers = nn.ModuleList([Layer(True), Layer(True), Layer(True), Layer(False), Layer(True)])

    model = Model()
    mla = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=512, dtype=torch.bfloat16)
    kda = MambaSpec(block_size=128, shapes=((6, 3), (2, 4, 4)), dtypes=(torch.bfloat16, torch.float32), mamba_type="linear_attention")
    groups = [
        KVCacheGroupSpec(["model.layers.3.self_attn.attn"], mla),
        KVCacheGroupSpec(["model.layers.0.self_attn", "model.layers.1.self_attn"], kda),
        KVCacheGroupSpec(["model.layers.2.self_attn", "model.layers.4.self_attn"], kda),
    ]
    return model, KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=groups)


def test_kda_layers_get_their_cache_group(runner):
    model, cfg = build(runner)
    runner.maybe_set_mamba_kv_cache_groups_ids(model, cfg)
    got = {i: model.model.layers[i].self_attn.cache_group_idx for i in (0, 1, 2, 4)}
    assert all(v is not None for v in got.values()), f"cache_group_idx left unset: {got}"
    assert {i: int(v) for i, v in got.items()} == {0: 1, 1: 1, 2: 2, 4: 2}
    assert got[0].dtype == torch.long and got[0].device == model.model.layers[0].self_attn.A_log.device


def test_a_layer_already_assigned_is_left_alone(runner):
    model, cfg = build(runner)
    model.model.layers[0].self_attn.cache_group_idx = torch.tensor(7)
    runner.maybe_set_mamba_kv_cache_groups_ids(model, cfg)
    assert int(model.model.layers[0].self_attn.cache_group_idx) == 7
    assert model.model.layers[1].self_attn.cache_group_idx is not None
