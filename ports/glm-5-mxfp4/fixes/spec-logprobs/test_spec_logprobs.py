"""spec-logprobs: under speculative decoding each token a request emits in a step comes with
its own logprobs (HPUModelRunner's real sample_tokens, packtests.sampling_runner: the real
spec-decode metadata, vLLM's RejectionSampler and Sampler; the scheduler reads them with
vLLM's LogprobsLists.slice_request, as Scheduler.update_from_output does)."""

import math

import pytest

from packtests.sampling_runner import VOCAB, add, make_runner, run_step, sampling_env

# the harness' logits: 10 for the favourite, 0 for the other tokens
TOP = 10.0 - math.log(math.exp(10.0) + VOCAB - 1)
OTHER = -math.log(math.exp(10.0) + VOCAB - 1)


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


def logprobs_of(runner, rid, n):
    """What Scheduler.update_from_output hands the request: the step's logprobs sliced at its
    batch index, one row per emitted token."""
    out = runner.last_output
    assert out.logprobs is not None, "no logprobs in the step's output"
    return out.logprobs.slice_request(out.req_id_to_index[rid], n)


def start(e, runner, prompts):
    for rid, kw in prompts.items():
        add(e, runner, rid, 4, **kw)
    runner.input_batch.refresh_sampling_metadata()
    first = {rid: [runner.favourite[rid][0]] for rid in prompts}
    assert run_step(e, runner, {rid: 4 for rid in prompts}, {}, batch_changed=True) == first


def test_each_emitted_token_has_its_logprobs_in_a_decode_step(env):
    e = env
    favourite = {"a": [5, 6, 7], "b": [9, 10, 11]}
    runner = make_runner(e, favourite, num_spec_tokens=2)
    runner.favourite = favourite
    start(e, runner, {"a": dict(temperature=0.0, logprobs=2), "b": dict(temperature=0.0, logprobs=2)})
    out = run_step(e, runner, {"a": 3, "b": 3}, {"a": 4, "b": 4}, drafts={"a": [5, 6], "b": [9, 3]}, batch_changed=True)
    assert out == {"a": [5, 6, 7], "b": [9, 10]}
    for rid, tokens in out.items():
        lp = logprobs_of(runner, rid, len(tokens))
        assert lp.logprob_token_ids.shape == (len(tokens), 3)
        # column 0: the emitted token and its logprob; then the two most likely tokens
        assert lp.logprob_token_ids[:, 0].tolist() == tokens
        assert lp.logprob_token_ids[:, 1].tolist() == tokens
        assert lp.logprobs[:, 0].tolist() == pytest.approx([TOP] * len(tokens), abs=1e-4)
        assert lp.logprobs[:, 2].tolist() == pytest.approx([OTHER] * len(tokens), abs=1e-4)
        assert lp.sampled_token_ranks.tolist() == [1] * len(tokens)


def test_a_decode_keeps_its_own_logprobs_beside_a_prompt(env):
    """A prompt in the same step has its one row; the verified decode still gets one row per
    token it emitted, not a zero row (token 0, logprob 0) in place of its own."""
    e = env
    favourite = {"a": [5, 6, 7], "p": [20, 21, 22]}
    runner = make_runner(e, favourite, num_spec_tokens=2)
    runner.favourite = favourite
    start(e, runner, {"a": dict(temperature=0.0, logprobs=1)})
    add(e, runner, "p", 4, temperature=0.0, logprobs=1)
    runner.input_batch.refresh_sampling_metadata()
    out = run_step(e, runner, {"a": 3, "p": 4}, {"a": 4}, drafts={"a": [5, 1]}, batch_changed=True)
    assert out == {"a": [5, 6], "p": [20]}
    lp = logprobs_of(runner, "a", 2)
    assert lp.logprob_token_ids[:, 0].tolist() == [5, 6]
    assert lp.logprobs[:, 0].tolist() == pytest.approx([TOP, TOP], abs=1e-4)
    lp = logprobs_of(runner, "p", 1)
    assert lp.logprob_token_ids[:, 0].tolist() == [20]
    assert lp.logprobs[:, 0].tolist() == pytest.approx([TOP], abs=1e-4)
