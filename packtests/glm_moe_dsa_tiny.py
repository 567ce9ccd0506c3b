"""A tiny glm_moe_dsa checkpoint in the Hub's layout, made by transformers 5.23.0.

GlmMoeDsaConfig scaled down: layer 0 dense, layers 1..N-1 MoE with 8 routed experts, saved by
`save_pretrained` in several shards (transformers writes the per-expert Hub keys
`mlp.experts.{e}.{gate,up,down}_proj.weight`). The MTP layer is added the way the release stores
it: as layer index num_hidden_layers, a full MoE decoder layer plus enorm, hnorm, eh_proj and
shared_head, in a shard of its own, named in the index. transformers ignores that layer on load.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

TOKENIZER_FILES = {
    "tokenizer_config.json": '{"model_max_length": 128, "tokenizer_class": "PreTrainedTokenizerFast"}\n',
    "tokenizer.json": '{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}}}\n',
    "chat_template.jinja": "{% for m in messages %}{{ m['content'] }}{% endfor %}\n",
    "LICENSE": "Tiny test licence: the converted checkpoint must carry this file.\n",
}


def config(num_hidden_layers: int = 3, n_routed_experts: int = 8, **overrides):
    """``overrides``: other GlmMoeDsaConfig fields (the e2e raises index_topk and the head sizes)."""
    from transformers import GlmMoeDsaConfig

    fields = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_hidden_layers=num_hidden_layers,
        first_k_dense_replace=1,
        n_routed_experts=n_routed_experts,
        num_experts_per_tok=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        index_topk=8,
        index_head_dim=32,
        index_n_heads=2,
        max_position_embeddings=128,
    )
    fields.update(overrides)
    return GlmMoeDsaConfig(**fields)


def make(
    path: str,
    num_hidden_layers: int = 3,
    n_routed_experts: int = 8,
    seed: int = 0,
    shard_size: str = "150KB",
    mtp: bool = True,
    **overrides,
) -> str:
    from transformers import GlmMoeDsaForCausalLM

    torch.manual_seed(seed)
    cfg = config(num_hidden_layers, n_routed_experts, **overrides)
    model = GlmMoeDsaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():  # routed experts are initialised to zero-mean weights of real-model scale
        for name, p in model.named_parameters():
            if ".mlp.experts." in name:
                p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():  # kept in fp32 in the release, as transformers loads it
            if name.endswith("e_score_correction_bias"):
                b.data = b.data.float()
    model.save_pretrained(path, max_shard_size=shard_size)
    index_path = os.path.join(path, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    if mtp:
        _add_mtp_layer(path, index, cfg, seed)
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)
    for name, text in TOKENIZER_FILES.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    return path


def _add_mtp_layer(path: str, index: dict, cfg, seed: int) -> None:
    """Layer num_hidden_layers: the last decoder layer's tensor set, new values, plus the MTP heads."""
    from safetensors import safe_open

    last = cfg.num_hidden_layers - 1
    mtp = cfg.num_hidden_layers
    gen = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    for name, shard in sorted(index["weight_map"].items()):
        prefix = f"model.layers.{last}."
        if name.startswith(prefix):
            with safe_open(os.path.join(path, shard), "pt") as f:
                t = f.get_tensor(name)
            new = (torch.randn(t.shape, generator=gen) * 0.02).to(t.dtype)
            tensors[f"model.layers.{mtp}." + name[len(prefix) :]] = new
    h = cfg.hidden_size
    tensors[f"model.layers.{mtp}.enorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors[f"model.layers.{mtp}.hnorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors[f"model.layers.{mtp}.eh_proj.weight"] = (torch.randn(h, 2 * h, generator=gen) * 0.02).bfloat16()
    tensors[f"model.layers.{mtp}.shared_head.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    tensors[f"model.layers.{mtp}.shared_head.head.weight"] = (
        torch.randn(cfg.vocab_size, h, generator=gen) * 0.02
    ).bfloat16()
    shard = "model-mtp.safetensors"
    save_file(tensors, os.path.join(path, shard), metadata={"format": "pt"})
    for name in tensors:
        index["weight_map"][name] = shard
    meta = index.setdefault("metadata", {})
    if "total_size" in meta:
        meta["total_size"] += sum(t.numel() * t.element_size() for t in tensors.values())
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        c = json.load(f)
    c["num_nextn_predict_layers"] = 1
    with open(cfg_path, "w") as f:
        json.dump(c, f, indent=2)


def convert(src, dst, python: str) -> None:
    """The port's converter (``python -m glm5_mxfp4.convert SRC DST``) in a process of ``python``."""
    import subprocess
    from pathlib import Path

    port = Path(__file__).resolve().parents[1] / "ports" / "glm-5-mxfp4"
    proc = subprocess.run(
        [python, "-m", "glm5_mxfp4.convert", str(src), str(dst), "--quiet"],
        cwd=port,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{port}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert proc.returncode == 0, proc.stderr


def dequantized_reference(src, dst, dtype):
    """transformers 5.23.0's GlmMoeDsaForCausalLM from the bf16 checkpoint ``src`` in ``dtype``, its
    routed experts replaced by the glm5_mxfp4 converter's dequantization of ``dst``'s blocks (what
    an MXFP4 serving path must compute); returns (model, number of experts replaced)."""
    from pathlib import Path

    from safetensors import safe_open
    from transformers import GlmMoeDsaForCausalLM

    from glm5_mxfp4 import mxfp4

    dst = Path(dst)
    weight_map = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]

    def deq(key):
        with safe_open(str(dst / weight_map[key + ".weight"]), "np") as f:
            q = f.get_tensor(key + ".weight")
        with safe_open(str(dst / weight_map[key + ".weight_scale"]), "np") as f:
            s = f.get_tensor(key + ".weight_scale")
        return torch.from_numpy(mxfp4.dequantize(q, s)).to(dtype)

    model = GlmMoeDsaForCausalLM.from_pretrained(src, dtype=dtype).eval()
    model.config._experts_implementation = "eager"
    replaced = 0
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            experts = getattr(layer.mlp, "experts", None)
            if experts is None:
                continue
            for e in range(experts.num_experts):
                prefix = f"model.layers.{i}.mlp.experts.{e}"
                experts.gate_up_proj[e] = torch.cat([deq(prefix + ".gate_proj"), deq(prefix + ".up_proj")])
                experts.down_proj[e] = deq(prefix + ".down_proj")
                replaced += 1
    return model, replaced


if __name__ == "__main__":  # python -m packtests.glm_moe_dsa_tiny DIR
    import sys

    print(make(sys.argv[1]))
