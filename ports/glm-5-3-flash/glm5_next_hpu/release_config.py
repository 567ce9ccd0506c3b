"""The published GLM-5.3-Flash's config.json as the port reads it, for the memory plan and the
config tests (the release's own config.json was not available to this project).

Text and vision fields: the vendored schema's defaults (``vllm/hf_config.py``), which are the real
45-layer model as transformers 5.23.0 declares it (34 KDA + 11 MLA layers, 288 routed experts of
2048, 64 heads, kv_lora 512, KDA 64 x 128), with the vision merger's ``out_hidden_size`` set to the
text hidden size (the 1536 default cannot merge into 4096). ``quantization_config``: block FP8 as
the README's "Block-FP8 checkpoints" section describes the release (e4m3, 128 x 128 fp32 inverse
scales, dynamic activations; KDA projections, kv_b_proj, the indexer's weights_proj, the router,
the vision tower, embeddings and lm_head in BF16).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .vllm.hf_config import TEXT_FIELDS, TOP_FIELDS, VISION_FIELDS, _default_list

ARCHITECTURE = "Glm5NextForConditionalGeneration"
BLOCK = [128, 128]
KDA_PROJ = ("q_proj", "k_proj", "v_proj", "f_a_proj", "f_b_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj")


def text_fields() -> dict[str, Any]:
    t = {name: default for name, (_, default) in TEXT_FIELDS.items()}
    for name in ("layer_types", "mlp_layer_types", "indexer_types"):
        t[name] = _default_list(name, t["num_hidden_layers"])
    return t


def modules_to_not_convert(text: dict[str, Any]) -> list[str]:
    """Every 2-D projection the release keeps in BF16, by checkpoint module name."""
    out = ["model.language_model.embed_tokens", "lm_head", "model.visual"]
    for i, kind in enumerate(text["layer_types"]):
        layer = f"model.language_model.layers.{i}"
        if kind == "linear_attention":
            out += [f"{layer}.self_attn.{p}" for p in KDA_PROJ]
        else:
            out += [f"{layer}.self_attn.kv_b_proj", f"{layer}.self_attn.indexer.weights_proj"]
        if text["mlp_layer_types"][i] == "sparse":
            out.append(f"{layer}.mlp.gate")
    return out


def release_config(fp8: bool = True) -> dict[str, Any]:
    text = text_fields()
    vision = {name: default for name, (_, default) in VISION_FIELDS.items()}
    vision["out_hidden_size"] = text["hidden_size"]
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "glm5_next",
        **{name: default for name, (_, default) in TOP_FIELDS.items()},
        "text_config": {"model_type": "glm5_next_text", **text},
        "vision_config": {"model_type": "glm5_next_vision", **vision},
        "torch_dtype": "bfloat16",
    }
    if fp8:
        cfg["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": BLOCK,
            "modules_to_not_convert": modules_to_not_convert(text),
        }
    return cfg


def write_release_config(folder: str | Path, fp8: bool = True) -> Path:
    """config.json of the release (no weights) in ``folder``; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(release_config(fp8), indent=1))
    return folder


__all__ = ["ARCHITECTURE", "modules_to_not_convert", "release_config", "text_fields", "write_release_config"]
