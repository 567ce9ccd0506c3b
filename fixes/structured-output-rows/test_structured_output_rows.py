"""In a step with structured output, each logits row is sampled with its own request's
sampling parameters, and a prefill chunk that is not finished returns no token (sync
scheduling), driven through the real HPUModelRunner.sample_tokens."""
import pytest

from packtests.sampling_runner import add, make_runner, run_step, sampling_env


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


@pytest.mark.red_raises("RuntimeError")
def test_rows_are_sampled_with_their_own_parameters(env):
    """d1 may only produce token 5 (allowed_token_ids); p2 has no restriction. The rows
    are [decodes..., prefill rows...]; the pristine runner builds the parameters as
    [prompts..., decodes...], including prompts without a row."""
    e = env
    favourite = {"g": 10, "d1": 12, "pp": 30, "p2": 25}
    runner = make_runner(e, favourite)
    add(e, runner, "g", 4, temperature=0.0)
    add(e, runner, "d1", 4, temperature=0.0, allowed_token_ids=[5])
    add(e, runner, "pp", 40, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    # Step 1: g and d1 complete their prompts (g has a grammar), pp's first chunk.
    out = run_step(e, runner, {"g": 4, "d1": 4, "pp": 16}, {}, grammar={"g": 11}, batch_changed=True)
    assert out == {"g": [11], "d1": [5], "pp": []}

    # Step 2: p2 joins; g and d1 decode, pp continues, p2's prompt completes.
    add(e, runner, "p2", 4, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    out = run_step(e, runner, {"g": 1, "d1": 1, "pp": 16, "p2": 4}, {"g": 4, "d1": 4, "pp": 16},
                   grammar={"g": 11}, batch_changed=True)
    assert out == {"g": [11], "d1": [5], "pp": [], "p2": [25]}


def test_unfinished_prefill_chunk_returns_no_token(env):
    """Sync scheduling: the token of a prefill chunk that does not finish the prompt must not
    be returned (the scheduler would append it to the request as generated)."""
    e = env
    favourite = {"g": 10, "pp": 30}
    runner = make_runner(e, favourite)
    add(e, runner, "g", 4, temperature=0.0)
    add(e, runner, "pp", 64, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    out = run_step(e, runner, {"g": 4, "pp": 16}, {}, grammar={"g": 11}, batch_changed=True)
    assert out == {"g": [11], "pp": []}
    out = run_step(e, runner, {"g": 1, "pp": 16}, {"g": 4, "pp": 16}, grammar={"g": 12})
    assert out == {"g": [12], "pp": []}
    assert runner.requests["pp"].output_token_ids == []
