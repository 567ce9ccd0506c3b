"""Prompt logprobs on HPU: -1 means the whole vocabulary; a chunked prefill that is not
scheduled for a step (removed from the persistent batch and added back, as _update_states
does) keeps the logprobs of its earlier chunks; a request that already returned its prompt
logprobs does not compute and return them again when it is re-added.

Runs the real InputBatch (add_request / remove_request / condense) and the runner's real
_get_prompt_logprobs_dict; the model is a fixed linear head on CPU.
"""

from types import SimpleNamespace

import pytest

VOCAB = 32
HIDDEN = 8
PROMPT = [3, 17, 5, 9, 30, 1, 22, 14, 7, 11]  # 10 tokens -> 9 prompt logprobs


@pytest.fixture()
def env(tree):
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.sampler import Sampler
    from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

    gen = torch.Generator().manual_seed(0)
    head = torch.randn(HIDDEN, VOCAB, generator=gen)
    hidden = torch.randn(len(PROMPT), HIDDEN, generator=gen)  # the prompt's hidden states

    batch = InputBatch(max_num_reqs=4, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=VOCAB, block_sizes=[4], kernel_block_sizes=[4])
    runner = object.__new__(HPUModelRunner)
    runner.__dict__.update(input_batch=batch, requests={}, device=torch.device("cpu"),
                           model=SimpleNamespace(compute_logits=lambda hs: hs @ head),
                           sampler=SimpleNamespace(compute_logprobs=Sampler.compute_logprobs))

    def add(req_id, prompt_logprobs):
        state = CachedRequestState(req_id=req_id, prompt_token_ids=list(PROMPT), mm_features=[],
                                   sampling_params=SamplingParams(max_tokens=8, prompt_logprobs=prompt_logprobs),
                                   generator=None, block_ids=[[1, 2, 3]], num_computed_tokens=0, output_token_ids=[])
        runner.requests[req_id] = state
        batch.add_request(state)
        return state

    def step(req_id, num_scheduled):
        """One prefill chunk of req_id: what _get_prompt_logprobs_dict returns this step."""
        state = runner.requests[req_id]
        start = state.num_computed_tokens
        out = runner._get_prompt_logprobs_dict({req_id: hidden[start:start + num_scheduled]},
                                               SimpleNamespace(num_scheduled_tokens={req_id: num_scheduled}))
        state.num_computed_tokens += num_scheduled
        if start + num_scheduled >= len(PROMPT):
            state.output_token_ids.append(4)  # the token sampled at the end of the prompt
        return out

    held = []

    def unscheduled_step(req_id):
        """The request is left out of one step: removed from the batch, then added back."""
        index = batch.remove_request(req_id)
        batch.condense([index])
        # Other work in that step reuses freed memory; without this a freshly allocated
        # torch.empty tensor could happen to hold the dropped rows again.
        n = len(PROMPT) - 1
        held.extend([torch.full((n, 3), -7, dtype=torch.int32), torch.full((n, 3), float("nan")),
                     torch.full((n, ), -7, dtype=torch.int32)] * 4)
        batch.add_request(runner.requests[req_id])

    expected = (hidden @ head).log_softmax(-1)
    return SimpleNamespace(batch=batch, runner=runner, add=add, step=step, unscheduled_step=unscheduled_step,
                           expected=expected, hidden=hidden)


def target_logprobs(lp):
    return lp.logprobs[:, 0]


@pytest.mark.red_raises("RuntimeError")
def test_minus_one_means_whole_vocabulary(env):
    import torch

    env.add("r", prompt_logprobs=-1)
    out = env.step("r", len(PROMPT))
    lp = out["r"]
    assert lp.logprob_token_ids.shape == (len(PROMPT) - 1, VOCAB + 1)
    torch.testing.assert_close(target_logprobs(lp), env.expected[range(9), PROMPT[1:]])
    # The top-k part lists every token.
    assert sorted(lp.logprob_token_ids[0, 1:].tolist()) == list(range(VOCAB))


def test_sample_logprobs_minus_one_is_whole_vocabulary(env):
    from vllm.sampling_params import SamplingParams
    from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState

    state = CachedRequestState(req_id="s", prompt_token_ids=list(PROMPT), mm_features=[],
                               sampling_params=SamplingParams(max_tokens=8, logprobs=-1), generator=None,
                               block_ids=[[1]], num_computed_tokens=0, output_token_ids=[])
    env.batch.add_request(state)
    # The sampler gathers max_num_logprobs per row; -1 would take its "unsorted" branch, whose
    # empty token-id tensor _build_logprobs_output cannot index, and with other requests in the
    # batch the -1 request would get only their top-k.
    assert env.batch.max_num_logprobs == VOCAB


def test_chunk_survives_an_unscheduled_step(env):
    import torch

    env.add("r", prompt_logprobs=2)
    assert env.step("r", 4) == {}
    env.unscheduled_step("r")
    out = env.step("r", 6)
    lp = out["r"]
    assert lp.logprob_token_ids[:, 0].tolist() == PROMPT[1:], "target token ids of the earlier chunk were lost"
    torch.testing.assert_close(target_logprobs(lp), env.expected[range(9), PROMPT[1:]])


def test_readded_request_does_not_return_prompt_logprobs_again(env):
    import torch

    env.add("r", prompt_logprobs=2)
    first = env.step("r", len(PROMPT))
    assert "r" in first
    assert "r" not in env.batch.num_prompt_logprobs
    # Unscheduled for a step, or preempted and resumed: it is added back with its output.
    env.unscheduled_step("r")
    state = env.runner.requests["r"]
    state.num_computed_tokens = 0  # a resume without cache hits re-prefills prompt + output
    resumed_hidden = torch.cat([env.hidden, env.hidden[-1:]])  # prompt + the one output token
    again = env.runner._get_prompt_logprobs_dict({"r": resumed_hidden},
                                                 SimpleNamespace(num_scheduled_tokens={"r": len(PROMPT) + 1}))
    assert again == {}, "prompt logprobs returned a second time"
    assert "r" not in env.batch.num_prompt_logprobs
