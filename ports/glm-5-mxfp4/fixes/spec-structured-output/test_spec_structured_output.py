"""spec-structured-output: under speculative decoding a request with a grammar is verified like any
other, on logits masked by the grammar's 1 + k rows (its state before each draft), as vLLM's GPU
runner does (HPUModelRunner's real sample_tokens and apply_grammar_bitmask,
packtests.sampling_runner: the real spec-decode metadata, vLLM's RejectionSampler and Sampler)."""

import pytest

from packtests.sampling_runner import add, make_runner, run_step, sampling_env


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


# Request a at its three verify positions: unmasked, the target would choose 5, 7 and 9; the
# grammar allows only 6, then 8, then 9, and a's drafts are 6 and 8.
A = [{5: 10.0, 6: 9.0}, {7: 10.0, 8: 9.0}, {9: 10.0}]
A_MASKS = [6, 8, 9]


def started(e, favourite, **prompts):
    runner = make_runner(e, favourite, num_spec_tokens=2)
    for rid in prompts:
        add(e, runner, rid, 4, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    first = {rid: tok for rid, tok in prompts.items()}
    out = run_step(e, runner, {rid: 4 for rid in prompts}, {}, grammar={"a": 6}, batch_changed=True)
    assert out == {rid: [tok] for rid, tok in first.items()}
    return runner


@pytest.mark.red_raises("UnboundLocalError")
def test_a_structured_prompt_is_sampled_when_drafting_follows(env):
    """The first step of a structured request under speculation (the prompt: its mask row,
    then the drafter): the engine stopped there, the drafter's arguments unset."""
    e = env
    started(e, {"a": A, "b": [9, 10, 11]}, a=6, b=9)


def verified(e, a_masks):
    """The verify step after ``started``: a (grammar rows ``a_masks``) drafted 6, 8 and b (no
    grammar) drafted 9, 10; the tokens each keeps."""
    runner = started(e, {"a": A, "b": [9, 10, 11]}, a=6, b=9)
    return run_step(
        e,
        runner,
        {"a": 3, "b": 3},
        {"a": 4, "b": 4},
        grammar={"a": a_masks},
        drafts={"a": [6, 8], "b": [9, 10]},
        batch_changed=True,
    )


@pytest.mark.red_raises("UnboundLocalError")
def test_drafts_of_a_structured_decode_are_verified_on_the_masked_rows(env):
    # a: each verify row masked by its own grammar row, so the target is 6, 8 (both drafts
    # accepted) and the bonus 9; b, no grammar, as without one
    assert verified(env, A_MASKS) == {"a": [6, 8, 9], "b": [9, 10, 11]}


@pytest.mark.red_raises("UnboundLocalError")
def test_a_draft_the_masked_target_differs_from_is_rejected(env):
    # the grammar allows 6 then 7 at the second row: the target there is 7, draft 8 rejected
    assert verified(env, [6, 7, 9]) == {"a": [6, 7], "b": [9, 10, 11]}


@pytest.mark.red_raises("UnboundLocalError")
def test_a_verified_structured_decode_beside_a_structured_prompt(env):
    """A prompt in the same step keeps its own row and mask; the decode keeps all its tokens."""
    e = env
    runner = started(e, {"a": A, "p": {20: 10.0, 21: 9.0}}, a=6)
    add(e, runner, "p", 4, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    out = run_step(
        e,
        runner,
        {"a": 3, "p": 4},
        {"a": 4},
        grammar={"a": A_MASKS, "p": 21},
        drafts={"a": [6, 8]},
        batch_changed=True,
    )
    assert out == {"a": [6, 8, 9], "p": [21]}
