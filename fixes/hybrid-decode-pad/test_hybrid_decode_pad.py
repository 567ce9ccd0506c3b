"""Hybrid model with a KV block larger than the attention kernel block (GLM-5.3-Flash: a
640-token block from the KDA state page, HPU attention kernel blocks of 128): padded decode
rows must write into the attention cache's spare kernel block, never into a live one, and the
decode block buckets must reach the kernel blocks that exist.

The runner's real initialize_kv_cache lays out a hybrid KV cache (one attention group, one
linear-attention group) on CPU, then the real _prepare_decode_inputs builds a padded decode
batch. Stood in: the habana bridge, the host-to-device copy target (CPU), bind_kv_cache and
the input-batch rebuild (no model layers exist here), the attention group list (real HPU
backend class).
"""

from types import SimpleNamespace

import pytest

KV_BLOCK = 640  # tokens per KV-manager block
KERNEL = 128  # HPU attention kernel block (HPUAttentionBackend.get_supported_kernel_block_sizes)
NUM_BLOCKS = 12  # KV blocks in the pool
BPK = KV_BLOCK // KERNEL


@pytest.fixture()
def runner(tree, monkeypatch):
    import torch
    import vllm_gaudi.v1.worker.hpu_model_runner as hmr
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor,
                                            MambaSpec)
    from vllm_gaudi.attention.backends.hpu_attn import HPUAttentionBackend
    from vllm_gaudi.v1.worker.hpu_input_batch import InputBatch

    real_copy = hmr.async_h2d_copy
    monkeypatch.setattr(hmr, "async_h2d_copy",
                        lambda src, dst=None, dtype=None, device="hpu": real_copy(src, dst, dtype, device="cpu"))
    bound = {}
    monkeypatch.setattr(hmr, "bind_kv_cache", lambda kv_caches, *a, **k: bound.update(kv_caches))

    attn = FullAttentionSpec(block_size=KV_BLOCK, num_kv_heads=1, head_size=4, dtype=torch.bfloat16)
    state = MambaSpec(block_size=KV_BLOCK, shapes=((2, 4), ), dtypes=(torch.float32, ),
                      mamba_type="linear_attention")
    config = KVCacheConfig(num_blocks=NUM_BLOCKS,
                           kv_cache_tensors=[
                               KVCacheTensor(size=attn.page_size_bytes * NUM_BLOCKS, shared_by=["attn"]),
                               KVCacheTensor(size=state.page_size_bytes * NUM_BLOCKS, shared_by=["kda"]),
                           ],
                           kv_cache_groups=[KVCacheGroupSpec(["attn"], attn),
                                            KVCacheGroupSpec(["kda"], state)])

    r = object.__new__(hmr.HPUModelRunner)
    r.__dict__.update(
        device=torch.device("cpu"), pin_memory=False, block_size=KV_BLOCK, attn_block_size=KV_BLOCK,
        vllm_config=SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context={}),
                                    cache_config=SimpleNamespace(block_size=KV_BLOCK)),
        model=SimpleNamespace(config=SimpleNamespace(architectures=["Glm5NextForConditionalGeneration"])),
        model_config=SimpleNamespace(dtype=torch.bfloat16, use_mla=False),
        shared_kv_cache_layers={}, runner_only_attn_layers=set(), kv_caches=[],
        _compact_gdn_group_ids=set(), _compact_gdn_group_offset={}, _compact_gdn_enabled=False,
        _original_max_num_seqs=4, num_mamba_like_layers=1, num_gdn=1, use_hybrid_cache=True,
        attn_groups=[[SimpleNamespace(backend=HPUAttentionBackend)], []], attn_backend=HPUAttentionBackend,
        enable_bucketing=False, use_contiguous_pa=False, uses_mrope=False, interleaved_sliding_window=False,
        model_has_chunked_attention=False, use_async_scheduling=False, get_dp_padding=lambda n: 0,
        cache_config=SimpleNamespace(mamba_block_size=KV_BLOCK), use_prefix_caching=False,
        positions_cpu=torch.zeros(64, dtype=torch.int64), input_ids_cpu=torch.zeros(64, dtype=torch.int32),
        # Decode batches of 1 are padded to 2.
        bucketing_manager=SimpleNamespace(find_decode_bucket=lambda bs, blocks, *a: (2, 1, max(blocks, 1))),
    )

    def reinit_batch(kv_cache_config, kernel_block_sizes):
        r.input_batch = InputBatch(max_num_reqs=4, max_model_len=4 * KV_BLOCK, max_num_batched_tokens=64,
                                   device=torch.device("cpu"), pin_memory=False, vocab_size=100,
                                   block_sizes=[KV_BLOCK, KV_BLOCK], kernel_block_sizes=kernel_block_sizes)

    r.may_reinitialize_input_batch = reinit_batch
    r.initialize_kv_cache(config)
    r.bound_kv_caches = bound
    return r


def test_setup_is_the_hybrid_layout(runner):
    # Kernel blocks of 128 tokens, NUM_BLOCKS * BPK of them plus one spare (flat slots).
    assert runner.attn_block_size == KERNEL
    key_cache = runner.bound_kv_caches["attn"][0]
    assert key_cache.shape[0] == (NUM_BLOCKS * BPK + 1) * KERNEL


def test_padded_decode_row_writes_to_the_spare_kernel_block(runner):
    from vllm.sampling_params import SamplingParams
    from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState

    batch = runner.input_batch
    # The request owns KV block 2 = kernel blocks 10..14, which include kernel block
    # NUM_BLOCKS (12), the pad block the pristine runner uses.
    owner = CachedRequestState(req_id="r", prompt_token_ids=list(range(1, 301)), mm_features=[],
                               sampling_params=SamplingParams(max_tokens=4), generator=None,
                               block_ids=[[2], [2]], num_computed_tokens=300, output_token_ids=[7])
    batch.add_request(owner)
    live_kernel_blocks = set(batch.block_table[0].get_cpu_tensor()[0, :BPK].tolist())
    assert NUM_BLOCKS in live_kernel_blocks

    runner.positions_cpu[0] = 300
    decode, _ = runner._prepare_decode_inputs(1, [1])
    slots = decode.attn_metadata.slot_mapping.flatten().tolist()
    assert len(slots) == 2
    pad_block = slots[1] // KERNEL
    assert pad_block not in live_kernel_blocks, (
        f"padded decode row writes into kernel block {pad_block}, part of request r's KV block 2")
    assert pad_block == NUM_BLOCKS * BPK  # the spare (+1) kernel block of the attention cache
    # The linear-attention state rows are per KV block: their pad stays the spare state row.
    assert decode.attn_metadata.load_indices_tensor[:, 1].tolist() == [NUM_BLOCKS, NUM_BLOCKS]


def test_decode_bucket_limit_counts_kernel_blocks(runner):
    seen = {}

    class Stop(Exception):
        pass

    def generate_decode_buckets():
        seen["num_hpu_blocks"] = manager.num_hpu_blocks
        raise Stop

    manager = SimpleNamespace(num_hpu_blocks=NUM_BLOCKS, block_size=KV_BLOCK, generate_prompt_buckets=lambda: None,
                              generate_decode_buckets=generate_decode_buckets)
    runner.__dict__.update(enable_bucketing=True, is_pooling_model=False, bucketing_manager=manager)
    with pytest.raises(Stop):
        runner.warmup_model()
    assert seen["num_hpu_blocks"] == NUM_BLOCKS * BPK
    assert manager.num_hpu_blocks == NUM_BLOCKS  # restored for prompt buckets


@pytest.mark.releases("v0.30.0")  # the ecf7b431 cap is on vllm-gaudi main, not in v0.26.0
@pytest.mark.red_raises("RuntimeError")
def test_contiguous_pa_decode_of_a_request_in_a_high_kv_block(runner):
    """Contiguous PA (the default without prefix caching): main caps the decode block bucket at
    _PAD_BLOCK_ID + 1 blocks (ecf7b431), read as the size of the attention cache. With the pad
    block counted in KV blocks that cap is NUM_BLOCKS + 1 kernel blocks, so a decode of a request
    whose kernel block ids lie above it is refused although the cache holds them."""
    from vllm.sampling_params import SamplingParams
    from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState

    runner.use_contiguous_pa = True
    batch = runner.input_batch
    # KV block 11 = kernel blocks 55..59 of the (NUM_BLOCKS * BPK + 1)-kernel-block cache.
    owner = CachedRequestState(req_id="r", prompt_token_ids=list(range(1, 301)), mm_features=[],
                               sampling_params=SamplingParams(max_tokens=4), generator=None,
                               block_ids=[[11], [11]], num_computed_tokens=300, output_token_ids=[7])
    batch.add_request(owner)
    runner.positions_cpu[0] = 300
    decode, _ = runner._prepare_decode_inputs(1, [1])
    block_list = decode.attn_metadata.block_list.tolist()
    # Contiguous PA lays the cache out by block id: the request's kernel block 57 (token 300)
    # sits at its own index, and the list reaches past it.
    assert len(block_list) >= 58
    assert block_list[57] == 57
    slots = decode.attn_metadata.slot_mapping.flatten().tolist()
    assert slots[0] == 57 * KERNEL + 300 % KERNEL
