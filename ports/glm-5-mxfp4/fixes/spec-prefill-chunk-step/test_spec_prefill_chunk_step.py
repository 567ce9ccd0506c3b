"""spec-prefill-chunk-step: under speculative decoding, a step whose only work is a prompt chunk that
does not finish its prompt runs: it samples nothing and the drafter is called as for any prefill
(HPUModelRunner's real sample_tokens, packtests.sampling_runner: the real InputBatch, the real
choice of logits rows, vLLM's Sampler and RejectionSampler; the drafter is a stand-in)."""

import pytest

from packtests.sampling_runner import add, make_runner, run_step, sampling_env


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


def long_prompt(e, favourite, **others):
    """A runner under MTP (one draft token) with ``others`` (id: prompt length), then a 60-token
    prompt "long" (the batch's decodes come first), every request greedy."""
    runner = make_runner(e, favourite, num_spec_tokens=1)
    for rid, n in others.items():
        add(e, runner, rid, n, temperature=0.0)
    add(e, runner, "long", 60, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    return runner


@pytest.mark.red_raises("UnboundLocalError")
def test_a_step_of_only_an_unfinished_prompt_chunk(env):
    """The long prompt's first 32 tokens alone: nothing sampled, the drafter called once for the
    step (with no sampling metadata: nothing was sampled); its next chunk finishes the prompt and
    samples its token."""
    e = env
    runner = long_prompt(e, {"long": 7})
    out = run_step(e, runner, {"long": 32}, {}, batch_changed=True)
    assert out == {"long": []}
    assert runner.propose_draft_token_ids.call_count == 1
    assert runner.propose_draft_token_ids.call_args.args[2] is None
    assert run_step(e, runner, {"long": 28}, {"long": 32}) == {"long": [7]}


def test_a_chunk_beside_a_decode_is_unchanged(env):
    """Guard: beside other work the chunk is as before: a short prompt sampled with the chunk in
    one step (the drafter given that sampling's metadata), then the short prompt's verify step
    (its draft accepted, the bonus token) beside the chunk that finishes the long prompt."""
    e = env
    runner = long_prompt(e, {"long": 7, "short": [6, 6]}, short=4)
    assert run_step(e, runner, {"short": 4, "long": 32}, {}, batch_changed=True) == {"short": [6], "long": []}
    assert runner.propose_draft_token_ids.call_args.args[2] is not None
    out = run_step(e, runner, {"short": 2, "long": 28}, {"short": 4, "long": 32}, drafts={"short": [6]})
    assert out == {"short": [6, 6], "long": [7]}
