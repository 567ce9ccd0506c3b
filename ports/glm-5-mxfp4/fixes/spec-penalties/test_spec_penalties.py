"""spec-penalties: under speculative decoding a request with penalties is verified with them,
each verify row seeing the request's output and the drafts before that row, as vLLM's
RejectionSampler defines (HPUModelRunner's real sample_tokens, packtests.sampling_runner: the
real spec-decode metadata, vLLM's RejectionSampler and Sampler, vllm-gaudi's ops)."""

import pytest

from packtests.sampling_runner import add, make_runner, run_step, sampling_env


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


# Token 5 logit 10, token 8 logit 9: a frequency penalty of 2 per earlier 5 turns the choice
# to 8 once 5 has been emitted.
CLOSE = {5: 10.0, 8: 9.0}


def two_requests(e, a_positions, **penalties):
    favourite = {"a": a_positions, "b": [9, 10, 11]}
    runner = make_runner(e, favourite, num_spec_tokens=2)
    add(e, runner, "a", 4, temperature=0.0, **penalties)
    add(e, runner, "b", 4, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    assert run_step(e, runner, {"a": 4, "b": 4}, {}, batch_changed=True) == {"a": [5], "b": [9]}
    return runner


@pytest.mark.red_raises("RuntimeError")
def test_a_draft_counts_in_the_penalties_of_the_rows_after_it(env):
    e = env
    # a's output after the prompt is [5]. Row 1 (after draft 8): 8 scores 10 - 2 = 8 only if
    # draft 8 counts in its history, so 6 (9) wins and draft 6 is kept; the bonus row sees
    # 5, 8 and 6: 6 scores 10 - 2 = 8 < 9, so 7.
    runner = two_requests(e, [CLOSE, {8: 10.0, 6: 9.0}, {6: 10.0, 7: 9.0}], frequency_penalty=2.0)
    # row 0: 5 is in the output, 5 scores 8 < 9: 8, draft 8 is kept
    out = run_step(
        e, runner, {"a": 3, "b": 3}, {"a": 4, "b": 4}, drafts={"a": [8, 6], "b": [9, 10]}, batch_changed=True
    )
    assert out == {"a": [8, 6, 7], "b": [9, 10, 11]}


@pytest.mark.red_raises("RuntimeError")
def test_a_draft_the_penalty_rules_out_is_rejected(env):
    e = env
    runner = two_requests(e, [CLOSE, CLOSE, CLOSE], frequency_penalty=2.0)
    # draft 5 at the first row: 5 is in the output once, so the target picks 8 and the
    # draft is replaced (b keeps all of its drafts in the same step)
    out = run_step(
        e, runner, {"a": 3, "b": 3}, {"a": 4, "b": 4}, drafts={"a": [5, 5], "b": [9, 10]}, batch_changed=True
    )
    assert out == {"a": [8], "b": [9, 10, 11]}
