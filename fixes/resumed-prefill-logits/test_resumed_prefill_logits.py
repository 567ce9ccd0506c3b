"""A request resumed after preemption with prefix-cache hits re-prefills its prompt and its
earlier outputs; only the last position may produce a logit, so it samples one token.

The runner's real `_extract_prefill_batch_contents` and `_is_prompt` run on a real
InputBatch filled by the real `add_request`, as `_update_states` does for a resumed or
re-added request (the request state keeps its outputs; num_computed_tokens is the
scheduler's, i.e. the prefix-cache hits after a resume).
"""

from types import SimpleNamespace

import pytest

BLOCK = 4
PROMPT = list(range(100, 110))  # 10 prompt tokens
OUTPUTS = [200, 201, 202, 203, 204]  # 5 tokens generated before preemption


@pytest.fixture()
def make(tree):
    """Returns (batch, runner, add) where add(req_id, prompt, outputs, computed) adds a request."""

    def build(use_async_scheduling=False):
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch
        from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

        batch = InputBatch(max_num_reqs=4, max_model_len=64, max_num_batched_tokens=64,
                           device=torch.device("cpu"), pin_memory=False, vocab_size=1000,
                           block_sizes=[BLOCK], kernel_block_sizes=[BLOCK])

        runner = object.__new__(HPUModelRunner)
        runner.input_batch = batch
        runner.num_mamba_like_layers = 0
        runner.attn_block_size = BLOCK
        runner.use_async_scheduling = use_async_scheduling
        runner.use_structured_output = False
        runner.invalid_req_indices = []
        runner.get_dp_padding = lambda n: 0
        # One prefill per batch: merging (bucketing) is not what is under test.
        runner._can_merge_prefill_contents = lambda lhs, rhs: False

        def add(req_id, prompt, outputs, computed):
            state = CachedRequestState(req_id=req_id, prompt_token_ids=list(prompt), mm_features=[],
                                       sampling_params=SamplingParams(max_tokens=32), generator=None,
                                       block_ids=[list(range(16))], num_computed_tokens=computed,
                                       output_token_ids=list(outputs))
            return batch.add_request(state)

        return batch, runner, add

    return build


def logits_positions(runner, scheduled):
    """Logits positions per request, for a step where every request in the batch is a prefill."""
    import numpy as np

    contents, _ = runner._extract_prefill_batch_contents(runner.input_batch.num_reqs, 0,
                                                         np.array(scheduled, dtype=np.int32))
    out = {}
    for c in contents:
        for rid, pos in zip(c.req_ids, c.logits_positions):
            out[rid] = pos
    return out


def sched(num_scheduled):
    return SimpleNamespace(num_scheduled_tokens=num_scheduled, scheduled_spec_decode_tokens={})


@pytest.mark.parametrize("use_async", [False, True])
def test_resume_with_prefix_hits_samples_one_token(make, use_async):
    batch, runner, add = make(use_async)
    # Preempted after 5 outputs; on resume 8 tokens (two blocks) hit the prefix cache, so the
    # scheduler schedules the remaining 15 - 8 = 7 tokens.
    add("resumed", PROMPT, OUTPUTS, computed=8)
    # A fresh prompt next to it, for contrast.
    add("fresh", list(range(300, 306)), [], computed=0)
    pos = logits_positions(runner, [7, 6])
    assert pos["fresh"] == [5]
    assert pos["resumed"] == [6], (f"resumed request gets logits at {pos['resumed']}: one sampled token per "
                                   "recomputed output position instead of one token")


def test_resume_with_prefix_hits_in_chunks(make):
    batch, runner, add = make()
    add("resumed", PROMPT, OUTPUTS, computed=4)
    # First chunk of the re-prefill covers tokens 4..11 (past the prompt, not the outputs):
    # nothing to sample yet.
    assert logits_positions(runner, [8])["resumed"] == []
    # Last chunk covers 12..14: one logit, at the last position.
    batch.num_computed_tokens_cpu[0] = 12
    assert logits_positions(runner, [3])["resumed"] == [2]


def test_resume_without_prefix_hits_unchanged(make):
    batch, runner, add = make()
    add("resumed", PROMPT, OUTPUTS, computed=0)
    assert batch.num_prompt_tokens[0] == len(PROMPT) + len(OUTPUTS)
    assert logits_positions(runner, [15])["resumed"] == [14]


def test_unscheduled_decode_readded_stays_a_decode(make):
    batch, runner, add = make()
    # Not scheduled for one step and added back: only its last sampled token is left to compute.
    add("d", PROMPT, OUTPUTS, computed=len(PROMPT) + len(OUTPUTS) - 1)
    add("p", list(range(300, 306)), [], computed=2)  # a chunked prefill re-added mid-prompt
    assert batch.num_prompt_tokens[0] == len(PROMPT)
    assert not runner._is_prompt(0, sched({"d": 1, "p": 4}))
    assert runner._is_prompt(1, sched({"d": 1, "p": 4}))
    assert batch.num_prompt_tokens[1] == 6
