"""Vendored GLM-5.3-Flash config schema, checked field by field against a checkpoint config.json.

The serving image's transformers (5.14.1) has no ``glm5_next``, so the plugin cannot rely on
transformers to parse the checkpoint's config. What is vendored here is the *schema* the port
depends on -- every declared field of transformers 5.23.0's ``Glm5NextTextConfig`` (49) and the
seven scalar fields of ``Glm5NextConfig`` (56 fields), with their type and default -- not
transformers' code. :func:`check_config_json` reads a config.json (nested ``text_config`` or the
flat text-only layout), checks every vendored field (present with the right type, or absent and
defaulted), the per-layer lists' lengths and values, and the port's serving constraints
(``validate_config``), and returns the text config as a namespace the port can build from.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..config import UnsupportedConfigError, validate_config

_NUM = (int, float)
_OPT_INT = (int, type(None))

#: Glm5NextTextConfig's 49 declared fields: name -> (accepted types, default). Defaults are those
#: of transformers 5.23.0 (the real 45-layer model).
TEXT_FIELDS: dict[str, tuple[tuple[type, ...], Any]] = {
    "vocab_size": ((int,), 154880),
    "hidden_size": ((int,), 4096),
    "intermediate_size": ((int,), 12288),
    "moe_intermediate_size": ((int,), 2048),
    "num_hidden_layers": ((int,), 45),
    "num_attention_heads": ((int,), 64),
    "num_key_value_heads": ((int,), 64),
    "n_shared_experts": ((int,), 1),
    "n_routed_experts": ((int,), 288),
    "output_router_logits": ((bool,), False),
    "routed_scaling_factor": (_NUM, 2.5),
    "kv_lora_rank": ((int,), 512),
    "q_lora_rank": ((int,), 1536),
    "qk_rope_head_dim": ((int,), 0),
    "v_head_dim": ((int,), 256),
    "qk_nope_head_dim": ((int,), 256),
    "n_group": ((int,), 1),
    "topk_group": ((int,), 1),
    "num_experts_per_tok": ((int,), 8),
    "norm_topk_prob": ((bool,), True),
    "hidden_act": ((str,), "silu"),
    "max_position_embeddings": ((int,), 1048576),
    "initializer_range": (_NUM, 0.02),
    "rms_norm_eps": (_NUM, 1e-05),
    "use_cache": ((bool,), True),
    "pad_token_id": (_OPT_INT, 154820),
    "bos_token_id": (_OPT_INT, None),
    "eos_token_id": ((int, list, type(None)), None),
    "tie_word_embeddings": ((bool,), False),
    "mlp_layer_types": ((list,), None),  # per layer; default: dense for the first 3, then sparse
    "attention_bias": ((bool,), False),
    "attention_dropout": (_NUM, 0.0),
    "index_topk": ((int,), 2048),
    "index_head_dim": ((int,), 128),
    "index_n_heads": ((int,), 32),
    "head_dim": (_OPT_INT, 0),
    "layer_types": ((list,), None),  # per layer; default: every 4th (i % 4 == 3) indexed_attention
    "indexer_types": ((list,), None),  # per layer; default: all "full"
    "swiglu_limit": (_NUM, 10.0),
    "linear_head_dim": ((int,), 128),
    "linear_num_heads": ((int,), 64),
    "linear_conv_kernel_dim": ((int,), 4),
    "linear_lower_bound": ((int, float, type(None)), -5.0),
    "hc_mult": ((int,), 4),
    "hc_eps": (_NUM, 1e-06),
    "hc_sinkhorn_iters": ((int,), 20),
    "router_aux_loss_coef": (_NUM, 0.001),
    "index_kpool": ((int,), 16),
    "index_kpool_always_select_tail": ((bool,), True),
}

#: Glm5NextConfig's scalar fields (text_config / vision_config are nested dicts).
TOP_FIELDS: dict[str, tuple[tuple[type, ...], Any]] = {
    "image_token_id": ((int,), 154854),
    "video_token_id": ((int,), 154855),
    "image_start_token_id": ((int,), 154830),
    "image_end_token_id": ((int,), 154831),
    "video_start_token_id": ((int,), 154832),
    "video_end_token_id": ((int,), 154833),
    "tie_word_embeddings": ((bool,), False),
}

#: Glm5NextVisionConfig's 18 declared fields (transformers 5.23.0 defaults). out_hidden_size must
#: equal the text hidden_size for images to merge (the default 1536 cannot; the release differs).
VISION_FIELDS: dict[str, tuple[tuple[type, ...], Any]] = {
    "depth": ((int,), 24),
    "hidden_size": ((int,), 1024),
    "hidden_act": ((str,), "silu"),
    "attention_bias": ((bool,), True),
    "attention_dropout": (_NUM, 0.0),
    "num_heads": ((int,), 16),
    "in_channels": ((int,), 3),
    "image_size": ((int, list), 336),
    "patch_size": ((int, list), 14),
    "rms_norm_eps": (_NUM, 1e-05),
    "spatial_merge_size": ((int,), 2),
    "temporal_patch_size": ((int, list), 2),
    "out_hidden_size": ((int,), 1536),
    "intermediate_size": ((int,), 4096),
    "initializer_range": (_NUM, 0.02),
    "rope_parameters": ((dict, type(None)), None),
    "projection_intermediate_size": ((int,), 10240),
    "swiglu_limit": (_NUM, 10.0),
}

#: Fields the port accepts on disk without using them (transformers' generic keys, and the six
#: attributes vLLM 0.33's glm5next reads that transformers does not declare).
KNOWN_EXTRA = {
    "model_type",
    "architectures",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "qk_head_dim",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "quantization_config",
    "auto_map",
    "mhc",
    "mla_use_nope",
    "scoring_func",
    "topk_method",
    "num_nextn_predict_layers",
    "indexer_rope_interleave",
    "moe_router_dtype",
    "return_dict",
    "output_hidden_states",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
    "tokenizer_class",
    "_name_or_path",
    "experts_implementation",
    "base_model_tp_plan",
}


class ConfigCheckError(ValueError):
    """config.json does not match the vendored schema; the message lists every field."""


def _default_list(name: str, n: int) -> list:
    if name == "layer_types":
        return ["indexed_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    if name == "mlp_layer_types":
        return ["dense" if i < 3 else "sparse" for i in range(n)]
    return ["full"] * n


def check_config_json(source: str | Path | dict, tp_size: int = 1, prefix_caching: bool = False):
    """Check a checkpoint config.json against the vendored schema.

    Returns ``(text, report)``: ``text`` a namespace holding all 49 text fields (the port builds
    from it), ``report`` a dict with ``checked`` (field -> "present"/"default"), ``extra``
    (unknown on-disk keys) and ``count``. Raises :class:`ConfigCheckError` naming every bad
    field, and :class:`UnsupportedConfigError` for what the port cannot serve.
    """
    if isinstance(source, dict):
        raw = source
    else:
        path = Path(source)
        raw = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    nested = isinstance(raw.get("text_config"), dict)
    text_raw = raw["text_config"] if nested else raw
    problems: list[str] = []
    checked: dict[str, str] = {}
    values: dict[str, Any] = {}

    def check(scope: str, table, src):
        for name, (types, default) in table.items():
            key = f"{scope}.{name}" if scope else name
            if name in src:
                v = src[name]
                ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
                if isinstance(v, float) and not math.isfinite(v):
                    ok = False
                if not ok:
                    problems.append(
                        f"{key}: {v!r} is {type(v).__name__}, expected {'/'.join(t.__name__ for t in types)}"
                    )
                values[name] = v
                checked[key] = "present"
            else:
                values.setdefault(name, default)
                checked[key] = "default"

    check("text_config" if nested else "", TEXT_FIELDS, text_raw)
    text_values = dict(values)
    if nested:
        values.clear()
        check("", TOP_FIELDS, raw)
        top_values = dict(values)
    else:
        top_values = {}
    n = text_values["num_hidden_layers"]
    for name, allowed in (
        ("layer_types", {"linear_attention", "indexed_attention", "full_attention"}),
        ("mlp_layer_types", {"dense", "sparse"}),
        ("indexer_types", {"full", "shared"}),
    ):
        lst = text_values.get(name)
        if lst is None:
            text_values[name] = lst = _default_list(name, n)
        if len(lst) != n:
            problems.append(f"{name}: {len(lst)} entries for num_hidden_layers={n}")
        bad = sorted(set(lst) - allowed)
        if bad:
            problems.append(f"{name}: unknown values {bad}")
    # Legacy spelling, remapped as transformers does.
    text_values["layer_types"] = [
        "indexed_attention" if t == "full_attention" else t for t in text_values["layer_types"]
    ]
    for name, expected in (
        ("scoring_func", "sigmoid"),
        ("topk_method", "noaux_tc"),
        ("mla_use_nope", True),
        ("mhc", True),
    ):
        if name in text_raw and text_raw[name] != expected:
            problems.append(f"{name}: {text_raw[name]!r}, the port implements {expected!r}")
    if "linear_attn_config" in text_raw:
        problems.append("linear_attn_config (Kimi layout): the vendored schema reads the flat linear_* fields")
    if text_values["linear_head_dim"] and text_values["linear_num_heads"] and text_values["num_attention_heads"]:
        if text_values["qk_nope_head_dim"] != text_values["v_head_dim"]:
            problems.append(
                f"qk_nope_head_dim ({text_values['qk_nope_head_dim']}) != v_head_dim ({text_values['v_head_dim']}): "
                "the expanded (CPU) attention form needs one head size"
            )
    known = set(TEXT_FIELDS) | KNOWN_EXTRA | ({"text_config", "vision_config"} | set(TOP_FIELDS) if nested else set())
    extra = sorted(set(text_raw) - known)
    if nested:
        extra += sorted(
            f"(top) {k}" for k in set(raw) - set(TOP_FIELDS) - KNOWN_EXTRA - {"text_config", "vision_config"}
        )
    if problems:
        raise ConfigCheckError(
            "config.json does not match the vendored GLM-5.3-Flash schema:\n  - " + "\n  - ".join(problems)
        )
    text = SimpleNamespace(**text_values)
    validate_config(text, tp_size=tp_size, prefix_caching=prefix_caching)
    report = {"checked": checked, "extra": extra, "count": len(checked), "top": top_values}
    return text, report


__all__ = [
    "ConfigCheckError",
    "TEXT_FIELDS",
    "TOP_FIELDS",
    "VISION_FIELDS",
    "UnsupportedConfigError",
    "check_config_json",
]
