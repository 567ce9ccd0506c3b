"""A tiny Qwen3-Next hybrid (gated delta-net linear attention + gated full attention + sparse MoE)
served by vllm-gaudi v0.26.0's own HPUModelRunner on the emulation, against transformers (bf16).

The linear-attention layer runs vllm-gaudi's HPU GDN path (``vllm_gaudi/models/qwen3_5.py``:
``HPUGatedDeltaNetAttention`` with ``ops/hpu_gdn_pytorch.py`` and ``ops/causal_conv1d_pytorch.py``);
the MoE goes through ``torch.ops.hpu.mixture_of_experts``. The GDN layer's reads of the attention
metadata are recorded (``probe_gdn``) so the tests also check the linear-attention state contract:
one state slot per sequence, ``has_initial_states_p`` on the later chunks of a chunked prefill,
``query_start_loc_p`` per sequence. Each case is one engine process (~30-60 s on 2 cores).
Runs under ``.venv-cpu``; skips elsewhere. Emulated results, not a card's.
"""

from __future__ import annotations

import sys
import time

import pytest

from packtests import runner_serve as rs  # noqa: E402

_reason = rs.vllm_available()
if _reason:
    pytest.skip(_reason, allow_module_level=True)

sys.path.insert(0, str(rs.EMULATION))
from hpu_harness import tiny_models  # noqa: E402

# Prompts whose reference greedy steps have no near-tie (the smallest top-2 gap is 0.109; the long
# prompt's is 0.094 over 4 tokens).
PROMPTS = [[23, 184, 215], [183, 31, 122, 53, 186], [40, 61, 57, 163, 114, 96, 181, 224], [229, 179, 236, 212]]
LONG = [(i * 37 + 11) % 250 for i in range(300)]  # three prefill chunks of 128 tokens


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    got = rs.release_tree(tmp_path_factory.mktemp("v0.26.0"))
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_models.qwen3_next(tmp_path_factory.mktemp("models") / "qwen3_next")


@pytest.fixture(scope="module")
def reference(model):
    return rs.reference_of(model, PROMPTS)


def _serve(tree, model, tmp_path, prompts, **kw):
    t0 = time.monotonic()
    proc, result, seconds = rs.serve(tree, model, prompts, runtime_dir=tmp_path / "rt", probe_gdn=True, **kw)
    assert result is not None, proc.stderr[-6000:]
    print(f"engine process {seconds:.1f} s (test {time.monotonic() - t0:.1f} s)")
    return result


def _check_contract(calls, n_prompts):
    prompts = [c for c in calls if c["prompt"]]
    decodes = [c for c in calls if not c["prompt"]]
    assert prompts and decodes
    for c in prompts:  # prefill: one sequence per call here (prompt bucket bs 1), its own slot
        n = len(c["query_start_loc"]) - 1
        assert len(c["state_indices"]) == len(c["has_initial_state"]) >= n
        assert c["query_start_loc"][-1] <= c["tokens"]
    # batched decode: each running sequence has its own state slot (slot 0 is not used: the compact
    # GDN slots are base_slot * groups + offset + 1, padding rows get -1)
    widest = max(decodes, key=lambda c: len(c["query_start_loc"]))
    live = [i for i in widest["state_indices"] if i >= 0]
    assert len(live) == len(set(live)) == n_prompts and 0 not in live


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_qwen3_next_greedy_tokens_equal_transformers(tree, model, reference, tmp_path, lazy):
    result = _serve(tree, model, tmp_path, PROMPTS, lazy=lazy)
    assert reference.check(result["batched"]) == 32
    assert reference.check(result["alone"]) == 32
    _check_contract(result["gdn_calls"], len(PROMPTS))


def test_qwen3_next_chunked_prefill_carries_the_state(tree, model, tmp_path):
    """A 300-token prompt at 128 tokens per step (three prefill chunks, the later two start from the
    saved conv/SSM state) batched with a short one, and each alone."""
    prompts = [LONG, PROMPTS[0]]
    ref = rs.reference_of(model, prompts, new_tokens=4)
    engine = {"max_model_len": 512, "max_num_batched_tokens": 128, "enable_chunked_prefill": True}
    result = _serve(tree, model, tmp_path, prompts, tokens=4, engine=engine)
    assert ref.check(result["batched"]) == 8
    assert ref.check(result["alone"]) == 8
    chunks = [c for c in result["gdn_calls"] if c["prompt"] and c["query_start_loc"][-1] in (128, 44)]
    assert [c["has_initial_state"][0] for c in chunks[:3]] == [False, True, True], result["gdn_calls"]
    assert len({c["state_indices"][0] for c in chunks[:3]}) == 1  # the same slot across the chunks


def test_negative_control_dropped_initial_state_fails(tree, model, tmp_path, monkeypatch):
    """The chunked prefill with the carried state dropped (each chunk starts from zeros) must not
    pass: the tokens differ from the reference."""
    prompts = [LONG]
    ref = rs.reference_of(model, prompts, new_tokens=4)
    engine = {"max_model_len": 512, "max_num_batched_tokens": 128, "enable_chunked_prefill": True}
    monkeypatch.setenv("RUNNER_SERVE_FAULT", "drop_initial_state")
    proc, result, seconds = rs.serve(
        tree, model, prompts, runtime_dir=tmp_path / "rt", tokens=4, alone=False, engine=engine
    )
    print(f"engine process {seconds:.1f} s")
    assert result is not None, proc.stderr[-6000:]  # the fault runs; only the tokens may tell
    with pytest.raises(AssertionError):
        ref.check(result["batched"])
