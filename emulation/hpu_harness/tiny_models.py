"""Tiny random checkpoints written with the transformers reference, for runs on the emulation.

Each builder writes a Hugging Face folder (config, safetensors weights, an offline WordLevel
tokenizer) that vLLM loads and transformers reads back as the reference. Weights are random with
a fixed seed; the scale of the initialisation is raised so that greedy choices are not near-ties.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 256


def _tokenizer(dest: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 2)}
    vocab["<unk>"] = VOCAB - 2
    vocab["</s>"] = VOCAB - 1
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>", pad_token="</s>")
    tok.save_pretrained(dest)


def _save(model, dest: Path, dtype) -> Path:
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model.to(dtype).save_pretrained(dest, safe_serialization=True)
    _tokenizer(dest)
    return dest


def llama(dest: Path, dtype_name: str = "bfloat16") -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=VOCAB - 1,
        bos_token_id=0,
        torch_dtype=dtype_name,
    )
    return _save(LlamaForCausalLM(cfg), Path(dest), getattr(torch, dtype_name))


def deepseek_v2(dest: Path, dtype_name: str = "bfloat16") -> Path:
    """MLA (kv_lora 64) with a fused MoE: 4 routed experts, top 2, one shared; layer 0 dense."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=32,
        v_head_dim=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=VOCAB - 1,
        bos_token_id=0,
        torch_dtype=dtype_name,
        rope_scaling=None,
    )
    return _save(DeepseekV2ForCausalLM(cfg), Path(dest), getattr(torch, dtype_name))
