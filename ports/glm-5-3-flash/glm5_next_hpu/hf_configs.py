"""transformers config classes for ``glm5_next`` (and ``glm5_next_text`` / ``glm5_next_vision``),
registered with ``AutoConfig`` by the plugin when the installed transformers has none.

The stock vllm-gaudi v0.26.0 image ships transformers 5.14.1, which does not know ``glm5_next``:
vLLM's ``get_config`` (``AutoConfig.from_pretrained``) then raises before a worker starts. vLLM
loads general plugins in ``EngineArgs.__post_init__``, before it parses the model config, so
registering here is early enough for ``vllm serve`` and ``EngineArgs.create_model_config()``.

The fields, their defaults and the per-layer list defaults are the port's own vendored schema
(``vllm/hf_config.py`` ``TEXT_FIELDS`` / ``TOP_FIELDS`` / ``VISION_FIELDS``, the real 45-layer
model's values as transformers 5.23.0 declares them); the classes are generated from it, so the
schema the plugin checks config.json against and the class that parses it cannot drift apart.
Where transformers knows ``glm5_next`` (5.23.0 and later) its own classes are used and nothing
is registered.
"""

from __future__ import annotations

import copy
from typing import Any

from .vllm.hf_config import TEXT_FIELDS, TOP_FIELDS, VISION_FIELDS, _default_list

MODEL_TYPE = "glm5_next"
TEXT_MODEL_TYPE = "glm5_next_text"
VISION_MODEL_TYPE = "glm5_next_vision"

_classes: dict[str, type] = {}


def _annotations(table: dict[str, tuple[tuple[type, ...], Any]]) -> dict[str, Any]:
    # The dataclass machinery of PreTrainedConfig (5.x) needs an annotation per field; the types
    # are checked by hf_config.check_config_json, not here.
    return {name: Any for name in table}


def _text_post_init(self, **kwargs) -> None:
    if self.num_key_value_heads is None:
        self.num_key_value_heads = self.num_attention_heads
    lin = kwargs.pop("linear_attn_config", None)  # Kimi-style spelling of the linear_* fields
    if isinstance(lin, dict):
        self.linear_head_dim = lin.get("head_dim", self.linear_head_dim)
        self.linear_num_heads = lin.get("num_heads", self.linear_num_heads)
        self.linear_conv_kernel_dim = lin.get("short_conv_kernel_size", self.linear_conv_kernel_dim)
        self.linear_lower_bound = lin.get("gate_lower_bound", self.linear_lower_bound)
    n = self.num_hidden_layers
    for name in ("layer_types", "mlp_layer_types", "indexer_types"):
        if getattr(self, name) is None:
            setattr(self, name, _default_list(name, n))
    # Legacy spelling of the MLA layers.
    self.layer_types = ["indexed_attention" if t == "full_attention" else t for t in self.layer_types]
    # head_dim is the RoPE part of a head (0: NoPE MLA), as transformers defines it for this model;
    # vLLM reads the MLA head size from kv_lora_rank once the model is detected as MLA.
    kwargs.pop("head_dim", None)
    self.head_dim = self.qk_rope_head_dim
    self.qk_head_dim = self.qk_rope_head_dim + self.qk_nope_head_dim
    self._glm5_base_post_init(**kwargs)


def _top_post_init(self, **kwargs) -> None:
    text_cls, vision_cls = _classes[TEXT_MODEL_TYPE], _classes[VISION_MODEL_TYPE]
    if self.text_config is None:
        # Flat (text-only) layout: the text fields sit at the top level.
        self.text_config = text_cls(
            **{k: v for k, v in kwargs.items() if k in TEXT_FIELDS or k == "linear_attn_config"}
        )
    elif isinstance(self.text_config, dict):
        self.text_config = text_cls(**self.text_config)
    if self.vision_config is None:
        self.vision_config = vision_cls()
    elif isinstance(self.vision_config, dict):
        self.vision_config = vision_cls(**self.vision_config)
    self._glm5_base_post_init(**{k: v for k, v in kwargs.items() if k not in TEXT_FIELDS})


def config_classes() -> dict[str, type]:
    """{model_type: class} for the three configs, built once against the installed transformers."""
    if _classes:
        return _classes
    from transformers import PretrainedConfig

    base_post_init = PretrainedConfig.__post_init__

    def make(name: str, model_type: str, table, post_init, extra: dict[str, Any]) -> type:
        ns: dict[str, Any] = {
            "model_type": model_type,
            "__module__": __name__,
            "__qualname__": name,
            "__annotations__": {**_annotations(table), **extra.pop("__annotations__", {})},
            "__post_init__": post_init,
            "_glm5_base_post_init": base_post_init,
        }
        for field, (_, default) in table.items():
            ns[field] = copy.deepcopy(default)
        ns.update(extra)
        return type(name, (PretrainedConfig,), ns)

    text = make(
        "Glm5NextTextConfig",
        TEXT_MODEL_TYPE,
        TEXT_FIELDS,
        _text_post_init,
        {
            "base_config_key": "text_config",
            "attribute_map": {"num_local_experts": "n_routed_experts"},
            "keys_to_ignore_at_inference": ["past_key_values"],
        },
    )
    vision = make(
        "Glm5NextVisionConfig",
        VISION_MODEL_TYPE,
        VISION_FIELDS,
        lambda self, **kw: self._glm5_base_post_init(**kw),
        {
            "base_config_key": "vision_config",
            "default_rope_type": "axial",
            "attribute_map": {"num_attention_heads": "num_heads", "num_hidden_layers": "depth"},
        },
    )
    _classes.update({TEXT_MODEL_TYPE: text, VISION_MODEL_TYPE: vision})
    top = make(
        "Glm5NextConfig",
        MODEL_TYPE,
        TOP_FIELDS,
        _top_post_init,
        {
            "__annotations__": {"text_config": Any, "vision_config": Any},
            "text_config": None,
            "vision_config": None,
            "sub_configs": {"text_config": text, "vision_config": vision},
            "keys_to_ignore_at_inference": ["past_key_values"],
        },
    )
    _classes[MODEL_TYPE] = top
    return _classes


def transformers_knows_glm5_next() -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return MODEL_TYPE in CONFIG_MAPPING and TEXT_MODEL_TYPE in CONFIG_MAPPING


def register_configs() -> bool:
    """Register the three classes with AutoConfig unless transformers has its own (then return
    False: its classes are the reference). Idempotent."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    classes = config_classes()
    if MODEL_TYPE in CONFIG_MAPPING and CONFIG_MAPPING[MODEL_TYPE] is not classes[MODEL_TYPE]:
        return False  # transformers' own glm5_next
    for model_type, cls in classes.items():
        AutoConfig.register(model_type, cls, exist_ok=True)
    return True


__all__ = ["MODEL_TYPE", "TEXT_MODEL_TYPE", "VISION_MODEL_TYPE", "config_classes", "register_configs"]
