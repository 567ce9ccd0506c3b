"""Each structured-output request's grammar bitmask lands on the logits row that request owns
in the step (HPUModelRunner.apply_grammar_bitmask, driven through the real sample_tokens),
also when a prefill chunk before it produced no logits row."""
import pytest

from packtests.sampling_runner import add, make_runner, run_step, sampling_env


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


@pytest.mark.red_raises("IndexError")
def test_mask_goes_to_owner_row_when_a_chunk_has_no_row(env):
    e = env
    favourite = {"d0": 10, "pp": 30, "p1": 20}
    runner = make_runner(e, favourite)
    add(e, runner, "d0", 4, temperature=0.0)
    add(e, runner, "pp", 40, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    # Step 1, no structured output: d0's prompt completes, pp's first chunk makes no logits.
    assert run_step(e, runner, {"d0": 4, "pp": 16}, {}, batch_changed=True) == {"d0": [10], "pp": []}

    # p1 joins. Step 2 is the first with a grammar: d0 decodes, pp is still a chunk (so the
    # scheduler sends no mask for it), p1's prompt completes. Rows: d0, then p1.
    add(e, runner, "p1", 4, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    out = run_step(e, runner, {"d0": 1, "pp": 16, "p1": 4}, {"d0": 4, "pp": 16}, grammar={"p1": 21, "d0": 11},
                   batch_changed=True)
    assert out == {"d0": [11], "pp": [], "p1": [21]}


@pytest.mark.red_raises("IndexError")
def test_mask_goes_to_owner_row_after_reordering(env):
    """The decodes-first reordering moves a request's batch index; its mask follows it."""
    e = env
    favourite = {"a": 10, "b": 20, "c": 30}
    runner = make_runner(e, favourite)
    add(e, runner, "a", 40, temperature=0.0)
    add(e, runner, "b", 4, temperature=0.0)
    add(e, runner, "c", 40, temperature=0.0)
    runner.input_batch.refresh_sampling_metadata()
    assert run_step(e, runner, {"a": 16, "b": 4, "c": 16}, {}, batch_changed=True) == {"a": [], "b": [20], "c": []}
    # b decodes and is swapped to the front; a and c are chunks, c's last one completes.
    out = run_step(e, runner, {"a": 16, "b": 1, "c": 24}, {"a": 16, "b": 4, "c": 16}, grammar={"c": 31, "b": 21})
    assert runner.input_batch.req_ids == ["b", "a", "c"]
    assert out == {"b": [21], "a": [], "c": [31]}
