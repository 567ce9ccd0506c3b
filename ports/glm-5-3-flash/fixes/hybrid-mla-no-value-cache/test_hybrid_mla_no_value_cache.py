"""initialize_kv_cache of an MLA + linear-attention model (GLM-5.3-Flash's layout: MLA layers
beside KDA layers) on vllm-gaudi's hybrid branch and its naive mamba-sharing branch: the MLA
layer gets its latent (key) cache and no value cache, which MLA never reads; a model without
MLA keeps both.

The runner's real initialize_kv_cache runs on CPU. Stood in: the habana bridge, bind_kv_cache
(it records what the runner binds), the input-batch rebuild (no model layers exist here); the
attention backends are vllm-gaudi's real classes.
"""

from types import SimpleNamespace

import pytest

KV_BLOCK = 640  # tokens per KV-manager block (the KDA state page sets it)
NUM_BLOCKS = 6
LATENT = 576  # kv_lora_rank 512 + rope 64: one latent row per token


def layout(tree, monkeypatch, *, use_mla: bool, branch: str):
    import torch
    import torch.nn as nn
    import vllm_gaudi.v1.worker.hpu_model_runner as hmr
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        MambaSpec,
        MLAAttentionSpec,
    )
    from vllm_gaudi.attention.backends.hpu_attn import HPUAttentionBackend, HPUMLAAttentionBackend

    bound = {}
    monkeypatch.setattr(hmr, "bind_kv_cache", lambda kv_caches, *a, **k: bound.update(kv_caches))
    spec_type, backend = (
        (MLAAttentionSpec, HPUMLAAttentionBackend) if use_mla else (FullAttentionSpec, HPUAttentionBackend)
    )
    attn = spec_type(block_size=KV_BLOCK, num_kv_heads=1, head_size=LATENT, dtype=torch.bfloat16)
    state = MambaSpec(block_size=KV_BLOCK, shapes=((2, 4),), dtypes=(torch.float32,), mamba_type="linear_attention")
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(size=attn.page_size_bytes * NUM_BLOCKS, shared_by=["attn"]),
            KVCacheTensor(size=state.page_size_bytes * NUM_BLOCKS, shared_by=["kda"]),
        ],
        kv_cache_groups=[KVCacheGroupSpec(["attn"], attn), KVCacheGroupSpec(["kda"], state)],
    )
    model = nn.Module()
    model.config = SimpleNamespace(architectures=["Glm5NextForConditionalGeneration"])
    r = object.__new__(hmr.HPUModelRunner)
    r.__dict__.update(
        device=torch.device("cpu"),
        pin_memory=False,
        block_size=128,
        attn_block_size=128,
        vllm_config=SimpleNamespace(
            compilation_config=SimpleNamespace(static_forward_context={}),
            cache_config=SimpleNamespace(block_size=KV_BLOCK),
        ),
        model=model,
        model_config=SimpleNamespace(dtype=torch.bfloat16, use_mla=use_mla),
        shared_kv_cache_layers={},
        runner_only_attn_layers=set(),
        kv_caches=[],
        _compact_gdn_group_ids=set(),
        _compact_gdn_group_offset={},
        _compact_gdn_enabled=True,
        _gdn_req_to_base_slot={},
        _original_max_num_seqs=4,
        num_mamba_like_layers=1,
        num_gdn=1,
        use_hybrid_cache=branch == "hybrid",
        use_naive_mamba_cache_sharing=branch == "naive",
        attn_groups=[[SimpleNamespace(backend=backend)], []],
        attn_backend=backend,
        enable_bucketing=False,
        use_contiguous_pa=False,
        uses_mrope=False,
        interleaved_sliding_window=False,
        model_has_chunked_attention=False,
        use_async_scheduling=False,
        get_dp_padding=lambda n: 0,
        cache_config=SimpleNamespace(mamba_block_size=KV_BLOCK),
        use_prefix_caching=False,
    )
    r.may_reinitialize_input_batch = lambda kv_cache_config, kernel_block_sizes: None
    r.initialize_kv_cache(config)
    return bound


@pytest.mark.parametrize("branch", ["hybrid", "naive"])
def test_an_mla_layer_gets_no_value_cache(tree, monkeypatch, branch):
    bound = layout(tree, monkeypatch, use_mla=True, branch=branch)
    key_cache, value_cache = bound["attn"][0], bound["attn"][1]
    # The latent cache is as before: one LATENT-wide row per token of every kernel block, plus
    # the spare block (hybrid: 640-token KV blocks split into 128-token kernel blocks).
    rows = (NUM_BLOCKS * (KV_BLOCK // 128) + 1) * 128 if branch == "hybrid" else (NUM_BLOCKS + 1) * KV_BLOCK
    assert key_cache.shape[0] == rows and key_cache.shape[-1] == LATENT
    assert value_cache is None, (
        f"{branch} branch allocated a value cache of {value_cache.numel() * value_cache.element_size():,} bytes "
        "for an MLA layer, which reads only its latent (key) cache"
    )
    assert len(bound["attn"]) == 4  # the tuple readers index stays (kc, vc, k_scales, v_scales)
    assert isinstance(bound["kda"], tuple) and bound["kda"][0].dtype.is_floating_point


@pytest.mark.parametrize("branch", ["hybrid", "naive"])
def test_a_model_without_mla_keeps_its_value_cache(tree, monkeypatch, branch):
    bound = layout(tree, monkeypatch, use_mla=False, branch=branch)
    key_cache, value_cache = bound["attn"][0], bound["attn"][1]
    assert value_cache is not None and value_cache.shape == key_cache.shape
