"""Checkpoint-key loading and the serving-config gate."""

import types

import pytest
import torch

from glm5_next_hpu.config import UnsupportedConfigError, validate_config
from glm5_next_hpu.reference import Glm5NextReference
from glm5_next_hpu.weights import Target, load_weights, map_checkpoint_key
from packtests.flash_reference import build_reference


def test_every_checkpoint_key_loads_and_every_port_parameter_is_filled(tiny):
    port = Glm5NextReference(tiny.config)
    loaded = load_weights(port, tiny.ckpt.items())
    assert loaded == set(tiny.ckpt)
    ref_sd = tiny.ref.state_dict()
    e = 5
    w13 = port.model.language_model.layers[1].mlp.experts.w13_weight[e]
    fused = ref_sd["model.language_model.layers.1.mlp.experts.gate_up_proj"][e]
    assert torch.equal(w13, fused)  # gate rows then up rows, as the reference's gate_up_proj
    A_log = tiny.ckpt["model.language_model.layers.0.self_attn.A_log"]
    assert A_log.shape == (4,)  # flat on disk


def test_checkpoint_names_differ_from_reference_module_names(tiny):
    # The mapping is exercised for real only if the stored names are the on-disk ones.
    keys = set(tiny.ckpt)
    assert "model.language_model.layers.0.self_attn.q_conv1d.weight" in keys
    assert "model.language_model.layers.0.hc_attn_fn" in keys
    assert "model.language_model.layers.1.mlp.experts.3.up_proj.weight" in keys
    assert not any("forget_gate" in k or "gate_up_proj" in k for k in keys)


def test_key_mapping_for_experts_and_mtp_layers():
    assert map_checkpoint_key("model.language_model.layers.7.mlp.experts.12.up_proj.weight", 45) == Target(
        "model.language_model.layers.7.mlp.experts.w13_weight", 12, "up"
    )
    assert map_checkpoint_key("model.language_model.layers.7.mlp.experts.2.down_proj.weight", 45).param.endswith(
        "w2_weight"
    )
    assert map_checkpoint_key("model.language_model.layers.45.self_attn.q_a_proj.weight", 45) is None
    assert map_checkpoint_key("lm_head.weight", 45) == Target("lm_head.weight")


def test_unknown_key_and_wrong_shape_and_missing_tensor_raise(tiny):
    port = Glm5NextReference(tiny.config)
    items = dict(tiny.ckpt)
    with pytest.raises(KeyError, match="no port parameter"):
        load_weights(port, [*items.items(), ("model.language_model.layers.0.self_attn.bogus", torch.zeros(1))])
    bad = dict(items)
    bad["model.language_model.layers.0.self_attn.A_log"] = torch.zeros(1, 1, 4, 1)
    with pytest.raises(ValueError, match="A_log"):
        load_weights(port, bad.items())
    missing = {k: v for k, v in items.items() if ".experts.3.gate_proj" not in k}
    with pytest.raises(ValueError, match="not fully loaded"):
        load_weights(port, missing.items())


@pytest.fixture(scope="module")
def cfg():
    return build_reference()[1]


def _text_with(cfg, **overrides):
    d = cfg.text_config.to_dict()
    d.update(overrides)
    return types.SimpleNamespace(**d)


def test_validate_config_accepts_the_tiny_and_default_configs(cfg):
    from transformers import Glm5NextConfig

    validate_config(cfg)
    validate_config(Glm5NextConfig(), tp_size=8)


@pytest.mark.parametrize(
    "kwargs, overrides, message",
    [
        (dict(prefix_caching=True), {}, "prefix caching is not supported"),
        ({}, dict(qk_rope_head_dim=64), "qk_rope_head_dim must be 0"),
        ({}, dict(hc_mult=2), "hc_mult must be 4"),
        (dict(tp_size=3), {}, "not divisible by the tensor-parallel size 3"),
        ({}, dict(linear_lower_bound=None), "Kimi softplus"),
        ({}, dict(indexer_types=["full", "shared", "full", "full"]), "shared"),
    ],
)
def test_validate_config_rejects_what_the_port_cannot_serve(cfg, kwargs, overrides, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        validate_config(_text_with(cfg, **overrides), **kwargs)


def test_model_construction_fails_fast_on_prefix_caching(cfg):
    with pytest.raises(UnsupportedConfigError, match="prefix caching"):
        Glm5NextReference(cfg, prefix_caching=True)
