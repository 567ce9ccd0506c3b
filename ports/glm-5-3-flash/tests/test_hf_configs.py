"""The plugin's generated config classes (``glm5_next_hpu.hf_configs``, registered only where
transformers lacks glm5_next) against transformers 5.23.0's own classes: the same release
config.json parses to the same values. Where transformers knows glm5_next nothing is registered.
(The 5.14.1 environment itself: test_hf_config_tf514.py.)"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
ref = pytest.importorskip("transformers.models.glm5_next.configuration_glm5_next")

from glm5_next_hpu.hf_configs import config_classes, register_configs  # noqa: E402
from glm5_next_hpu.release_config import release_config  # noqa: E402
from glm5_next_hpu.vllm.hf_config import TEXT_FIELDS, VISION_FIELDS  # noqa: E402


def test_nothing_is_registered_where_transformers_has_glm5_next():
    from transformers import AutoConfig

    assert register_configs() is False
    assert type(AutoConfig.for_model("glm5_next")) is ref.Glm5NextConfig


@pytest.mark.parametrize("layout", ["nested", "flat"])
def test_generated_classes_parse_as_transformers_does(layout):
    raw = release_config(fp8=False)
    if layout == "flat":  # text-only checkpoints keep the text fields at the top level
        raw = {**{k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}, **raw["text_config"]}
        raw["model_type"] = "glm5_next"
        # A legacy spelling both must remap, and per-layer lists both must default.
        raw["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in raw["layer_types"]]
        del raw["mlp_layer_types"], raw["indexer_types"]
    ours = config_classes()["glm5_next"](**raw)
    theirs = ref.Glm5NextConfig(**raw)
    for name in [*TEXT_FIELDS, "qk_head_dim"]:
        assert getattr(ours.text_config, name) == getattr(theirs.text_config, name), name
    assert ours.text_config.num_local_experts == theirs.text_config.num_local_experts == 288
    if layout == "nested":
        for name in VISION_FIELDS:
            assert getattr(ours.vision_config, name) == getattr(theirs.vision_config, name), name
        assert ours.vision_config.num_attention_heads == theirs.vision_config.num_attention_heads
    assert ours.get_text_config() is ours.text_config
    assert ours.text_config.model_type == "glm5_next_text"
