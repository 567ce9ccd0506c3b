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
    kda = MambaSpec(
        block_size=128,
        shapes=((6, 3), (2, 4, 4)),
        dtypes=(torch.bfloat16, torch.float32),
        mamba_type="linear_attention",
    )
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


def test_the_ports_own_kda_layers_get_their_cache_group(runner):
    """The same call on the port's real KDA layer (glm5_next_hpu.vllm.model.Glm5NextKDA, built for
    the port tests' tiny config at TP 1), placed where the port's model places it and named by the
    KV cache config as the runner names it (`model.language_model.layers.N.self_attn`)."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec, MLAAttentionSpec

    port = Path(__file__).resolve().parents[2]
    for p in (port, port / "tests"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    from glm5_next_hpu.vllm.model import Glm5NextKDA
    from glm5_next_hpu.vllm.parallel import Parallel
    from packtests.flash_reference import tiny_config

    cfg = tiny_config()
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(dtype=torch.bfloat16),
        cache_config=SimpleNamespace(mamba_cache_dtype="float32"),
        compilation_config=SimpleNamespace(static_forward_context={}),
    )
    layers = nn.ModuleList()
    for i, kind in enumerate(cfg.text_config.layer_types):
        layer = nn.Module()
        prefix = f"model.language_model.layers.{i}.self_attn"
        layer.self_attn = (
            Glm5NextKDA(cfg.text_config, vllm_config, prefix, par=Parallel(0, 1, False))
            if kind == "linear_attention"
            else nn.Linear(2, 2)
        )
        layers.append(layer)
    model = nn.Module()
    model.config = SimpleNamespace(architectures=["Glm5NextForConditionalGeneration"])  # as config.json names it
    model.model = nn.Module()
    model.model.language_model = nn.Module()
    model.model.language_model.layers = layers
    kda = [i for i, k in enumerate(cfg.text_config.layer_types) if k == "linear_attention"]
    assert kda and all(model.model.language_model.layers[i].self_attn.cache_group_idx is None for i in kda)
    first = model.model.language_model.layers[kda[0]].self_attn
    shapes = first.get_state_shape()
    state = MambaSpec(
        block_size=128, shapes=tuple(shapes), dtypes=tuple(first.get_state_dtype()), mamba_type="linear_attention"
    )
    mla = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=32, dtype=torch.bfloat16)
    names = [f"model.language_model.layers.{i}.self_attn" for i in kda]
    groups = [
        KVCacheGroupSpec(
            [
                f"model.language_model.layers.{i}.self_attn.attn"
                for i, k in enumerate(cfg.text_config.layer_types)
                if k != "linear_attention"
            ],
            mla,
        )
    ]
    groups += [KVCacheGroupSpec([n], state) for n in names]  # one group per KDA layer here
    runner.maybe_set_mamba_kv_cache_groups_ids(
        model, KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=groups)
    )
    got = [model.model.language_model.layers[i].self_attn.cache_group_idx for i in kda]
    assert all(v is not None for v in got), f"the port's KDA layers kept cache_group_idx None: {got}"
    assert [int(v) for v in got] == list(range(1, len(kda) + 1))
