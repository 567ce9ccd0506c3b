"""Two fresh prompts scheduled in the same step of a hybrid (mamba-like) model must be
prefilled in separate batches: HPUModelRunner._form_prefill_batch builds the mamba/GDN
state indices for one sequence per batch (and asserts it with prefix caching)."""

from functools import partial

import pytest
import torch

BLOCK = 128


def _runner(num_mamba_like_layers, *, merged_prefill, max_prefill_batch_size):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.worker.gpu_input_batch import CachedRequestState
    from vllm_gaudi.extension.bucketing.common import HPUBucketingManager
    from vllm_gaudi.v1.worker.hpu_input_batch import InputBatch
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner, get_dp_padding

    attn = KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64,
                                                        dtype=torch.bfloat16))
    groups = [attn]
    if num_mamba_like_layers:
        # Hybrid layout: the linear-attention state group first, attention second.
        groups = [KVCacheGroupSpec(["linear"], MambaSpec(block_size=BLOCK, shapes=((4, ), ), dtypes=(torch.float32, ))),
                  attn]

    runner = object.__new__(HPUModelRunner)  # the real class; only the fields this path reads are set
    runner.num_mamba_like_layers = num_mamba_like_layers
    runner.kv_cache_config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)
    runner.attn_block_size = BLOCK
    runner.use_async_scheduling = False
    runner.use_structured_output = False
    runner.use_merged_prefill = merged_prefill
    runner.max_prefill_batch_size = max_prefill_batch_size
    runner.max_num_tokens = 8192
    runner.bucketing_manager = HPUBucketingManager()  # not initialised: buckets = the exact shapes
    runner.get_dp_padding = partial(get_dp_padding, dp_size=1, dp_rank=0)

    batch = InputBatch(max_num_reqs=4, max_model_len=2048, max_num_batched_tokens=8192, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=1000, block_sizes=[BLOCK] * len(groups),
                       kernel_block_sizes=[BLOCK] * len(groups))
    for i, n in enumerate((100, 60)):
        batch.add_request(
            CachedRequestState(req_id=f"req-{i}", prompt_token_ids=list(range(1 + i, 1 + i + n)), mm_features=[],
                               sampling_params=SamplingParams(temperature=0.0), generator=None,
                               block_ids=tuple([i + 1] for _ in groups), num_computed_tokens=0,
                               output_token_ids=[]))
    runner.input_batch = batch
    return runner


def _prefill_batches(runner):
    contents, _ = runner._extract_prefill_batch_contents(num_prefills=2, num_decodes=0,
                                                          num_scheduled_tokens=[100, 60])
    return [c.req_ids for c in contents if c.req_ids]


# VLLM_PROMPT_BS_BUCKET_MAX=4 (2D prefill) and VLLM_MERGED_PREFILL=true both let two fresh
# prompts share one prefill batch.
LAYOUTS = [pytest.param(False, 4, id="2d-bs4"), pytest.param(True, 1, id="merged-prefill")]


@pytest.mark.parametrize("merged_prefill,bs_max", LAYOUTS)
def test_hybrid_model_prefills_one_request_per_batch(tree, merged_prefill, bs_max):
    runner = _runner(num_mamba_like_layers=4, merged_prefill=merged_prefill, max_prefill_batch_size=bs_max)
    assert _prefill_batches(runner) == [["req-0"], ["req-1"]]


@pytest.mark.parametrize("merged_prefill,bs_max", LAYOUTS)
def test_attention_only_model_still_merges(tree, merged_prefill, bs_max):
    runner = _runner(num_mamba_like_layers=0, merged_prefill=merged_prefill, max_prefill_batch_size=bs_max)
    assert _prefill_batches(runner) == [["req-0", "req-1"]]
