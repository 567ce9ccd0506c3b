"""vLLM detects GLM-5.3-Flash's NoPE MLA layers as MLA, and its real hybrid block-size arithmetic
then gives the recipe's 640-token KV block at TP 8.

The release's config.json as the port reads it (``glm5_next_hpu.release_config``: the real 45-layer
model, block FP8) goes through vLLM 0.26.0's real ``EngineArgs.create_model_config()`` with the
plugin registered; the block size through the real ``Platform._align_hybrid_block_size`` with
vllm-gaudi's ``HPUMLAAttentionBackend`` (kernel block 128) after its preferred-size step, as
``HpuPlatform.update_block_size_for_backend`` runs them once the model's layers exist."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

PORT_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture()
def model_config(tree, tmp_path, monkeypatch):
    import glm5_next_hpu
    from glm5_next_hpu.release_config import write_release_config

    # vLLM inspects the registered class in a child interpreter: it must import the same tree.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tree), str(PORT_DIR)]))
    glm5_next_hpu.register()
    from vllm.engine.arg_utils import EngineArgs

    ckpt = write_release_config(tmp_path / "glm-5.3-flash")
    args = EngineArgs(
        model=str(ckpt),
        tensor_parallel_size=8,
        enable_expert_parallel=True,
        max_model_len=262144,
        max_num_seqs=32,
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enable_prefix_caching=False,
    )
    return args.create_model_config()


def test_glm5_next_is_detected_as_mla(model_config):
    from vllm.config import ParallelConfig

    assert model_config.hf_text_config.model_type == "glm5_next_text"
    assert model_config.is_deepseek_mla
    assert model_config.use_mla
    # The latent cache: kv_lora_rank + qk_rope_head_dim (0, NoPE) = 512 wide, one KV head per rank.
    assert model_config.get_head_size() == 512
    assert model_config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=8)) == 1


def test_seed_block_size_at_tp8_is_640(model_config):
    from vllm.config import CacheConfig, ParallelConfig
    from vllm.config.vllm import set_current_vllm_config  # noqa: F401  (the arithmetic enters it)
    from vllm_gaudi.attention.backends.hpu_attn import HPUMLAAttentionBackend
    from vllm_gaudi.platform import HpuPlatform

    cache = CacheConfig(enable_prefix_caching=False)
    vllm_config = SimpleNamespace(
        model_config=model_config,
        cache_config=cache,
        parallel_config=ParallelConfig(tensor_parallel_size=8, enable_expert_parallel=True),
    )
    # Phase 1 of update_block_size_for_backend: the backend's preferred size; phase 2: hybrid alignment.
    cache.block_size = HPUMLAAttentionBackend.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)
    assert model_config.is_hybrid
    HpuPlatform._align_hybrid_block_size(vllm_config, HPUMLAAttentionBackend)
    # KDA state per layer at TP 8: conv 3 * 8 * 128 channels x 3 (bf16) + 8 x 128 x 128 fp32 = 542,720 bytes;
    # the 1,024-byte latent page per token needs 530 tokens, rounded up to the 128-token kernel block.
    assert cache.block_size == 640
    assert cache.mamba_page_size_padded == 640 * 512 * 2
