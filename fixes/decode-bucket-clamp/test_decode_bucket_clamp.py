"""Exponential decode block buckets (non-contiguous PA, the default with prefix caching) are
bounded by the allocated KV cache for dense models, and keep the full worst-case range for
models whose decode block references can legitimately reach it.

Runs the real HPUModelRunner.warmup_model on a partly built runner with the real
HPUBucketingManager and the real runtime config, up to the end of bucket generation (the
next step, the KV defragmenter, needs the device caches and is where the test stops)."""

import math

import pytest

# Qwen3-0.6B served with defaults on one card: the case reported upstream.
MAX_MODEL_LEN, BLOCK, MAX_SEQS, KV_BLOCKS = 40960, 128, 256, 7593


class _BucketsReady(Exception):
    pass


def _decode_buckets(monkeypatch, *, attn_block=BLOCK, num_gdn=0, num_mamba_like_layers=0, swa=False):
    from types import SimpleNamespace

    import vllm_gaudi.v1.worker.hpu_model_runner as hmr
    from vllm_gaudi.extension.bucketing.common import HPUBucketingManager
    from vllm_gaudi.extension.runtime import get_config

    assert get_config().bucketing_strategy == "exp" and not get_config().use_contiguous_pa

    manager = HPUBucketingManager()
    manager.initialize(max_num_seqs=MAX_SEQS, max_num_prefill_seqs=1, block_size=BLOCK, max_num_batched_tokens=8192,
                       max_model_len=MAX_MODEL_LEN)
    manager.num_hpu_blocks = KV_BLOCKS  # as initialize_kv_cache sets it

    runner = object.__new__(hmr.HPUModelRunner)  # the real class; only the fields warmup_model reads first
    runner.enable_bucketing = True
    runner.bucketing_manager = manager
    runner.is_pooling_model = False
    runner.supports_mm_inputs = False
    runner.block_size = BLOCK
    runner.attn_block_size = attn_block
    runner.num_gdn = num_gdn
    runner.num_mamba_like_layers = num_mamba_like_layers
    runner.interleaved_sliding_window = swa
    runner.input_batch = SimpleNamespace(max_num_reqs=MAX_SEQS)
    runner.kv_caches = []

    def stop(*args, **kwargs):
        raise _BucketsReady

    monkeypatch.setattr(hmr, "OnlineDefragmenter", stop)
    with pytest.raises(_BucketsReady):
        runner.warmup_model()
    return manager.decode_buckets


def test_dense_model_decode_buckets_fit_the_kv_cache(tree, monkeypatch):
    buckets = _decode_buckets(monkeypatch)
    top = max(blocks for _, _, blocks in buckets)
    worst = math.ceil(MAX_MODEL_LEN / BLOCK) * MAX_SEQS  # 81920
    assert top <= 3 * KV_BLOCKS, f"top decode bucket needs {top} blocks, the cache has {KV_BLOCKS} (worst case {worst})"
    # Still covers every batch that fits the physical cache.
    assert top >= KV_BLOCKS


@pytest.mark.parametrize(
    "model",
    [
        dict(num_gdn=24, num_mamba_like_layers=24),  # GDN hybrid (Qwen3.5)
        dict(num_mamba_like_layers=36),  # KDA/mamba-like hybrid (GLM-5.3-Flash)
        dict(swa=True),  # interleaved sliding window (Gemma 4)
        dict(attn_block=64),  # inflated KV block (Granite 4.0-H)
    ],
    ids=["gdn", "mamba-like", "interleaved-swa", "inflated-kv-block"])
def test_models_with_worst_case_references_keep_the_full_range(tree, monkeypatch, model):
    buckets = _decode_buckets(monkeypatch, **model)
    top = max(blocks for _, _, blocks in buckets)
    assert top == math.ceil(MAX_MODEL_LEN / model.get("attn_block", BLOCK)) * MAX_SEQS
