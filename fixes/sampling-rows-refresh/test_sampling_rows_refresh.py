"""Each request is sampled with its own temperature / top-k / penalties / prompt, also when
the runner reorders the persistent batch (decodes first) in a step where no request was
added or removed, and when a chunked prefill was not sampled in the step it joined."""

import functools
from types import SimpleNamespace

import pytest

VOCAB = 64


@pytest.fixture()
def mods(tree, monkeypatch):
    import torch
    from vllm.sampling_params import SamplingParams
    import vllm_gaudi.utils as gaudi_utils
    import vllm_gaudi.v1.worker.hpu_input_batch as hib
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

    # Hardware only: the real row update, with the "device" tensors on the CPU.
    monkeypatch.setattr(hib, "async_h2d_update", functools.partial(gaudi_utils.async_h2d_update, device="cpu"))

    class Runner:
        """The runner methods that reorder the batch, on a bare object holding the batch."""
        _ensure_decodes_first = HPUModelRunner._ensure_decodes_first
        _is_prompt = HPUModelRunner._is_prompt
        is_decoder_only = HPUModelRunner.is_decoder_only

        def __init__(self, batch):
            self.input_batch = batch

    return SimpleNamespace(torch=torch, SamplingParams=SamplingParams, hib=hib, Runner=Runner)


def make_batch(m):
    return m.hib.InputBatch(max_num_reqs=8, max_model_len=128, max_num_batched_tokens=128,
                            device=m.torch.device("cpu"), pin_memory=False, vocab_size=VOCAB,
                            block_sizes=[16], kernel_block_sizes=[16])


def add(m, batch, rid, prompt, **sp):
    state = m.hib.CachedRequestState(req_id=rid, prompt_token_ids=prompt, mm_features=[],
                                     sampling_params=m.SamplingParams(**sp), generator=None,
                                     block_ids=[[0]], num_computed_tokens=0, output_token_ids=[])
    batch.add_request(state)
    return state


def step(m, batch, scheduled, computed):
    """What a step does to the batch before sampling: _update_states advances computed
    tokens of cached requests, sample_tokens puts decodes first."""
    for rid, n in computed.items():
        batch.num_computed_tokens_cpu[batch.req_id_to_index[rid]] = n
    so = SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens={})
    m.Runner(batch)._ensure_decodes_first(so)


def sample_params(batch, states, rid, batch_changed):
    md = batch.make_selective_sampling_metadata([(rid, states[rid].output_token_ids)],
                                                skip_copy=not batch_changed)
    return (round(float(md.temperature[0]), 3), int(md.top_k[0]), round(float(md.repetition_penalties[0]), 3),
            None if md.prompt_token_ids is None else md.prompt_token_ids[0].tolist())


def test_sampled_rows_follow_their_request_across_reorders(mods):
    m = mods
    batch = make_batch(m)
    prompts = {"a": [1] * 32, "c": [2] * 32, "b": [3] * 4}
    own = {"a": (0.5, 5, 1.1), "c": (0.9, 7, 1.3), "b": (1.5, 9, 1.2)}
    states = {
        rid: add(m, batch, rid, prompts[rid], temperature=t, top_k=k, repetition_penalty=r)
        for rid, (t, k, r) in own.items()
    }

    def expect(rid):
        t, k, r = own[rid]
        # Prompt rows are padded with vocab_size up to the longest prompt in the batch.
        return (t, k, r, prompts[rid] + [VOCAB] * (32 - len(prompts[rid])))

    # Step 1: all three join (batch changed). a and c are chunked (16 of 32 tokens): no
    # logits; b's whole prompt is scheduled and b is sampled.
    batch.refresh_sampling_metadata()
    step(m, batch, {"a": 16, "c": 16, "b": 4}, {})
    assert sample_params(batch, states, "b", True) == expect("b")
    states["b"].output_token_ids.append(11)

    # Step 2, nothing added or removed: b decodes, a's last chunk completes, c goes on.
    # Decodes first: b is swapped in front of a.
    step(m, batch, {"a": 16, "c": 8, "b": 1}, {"a": 16, "c": 16, "b": 4})
    assert batch.req_ids == ["b", "c", "a"]
    assert sample_params(batch, states, "b", False) == expect("b")
    assert sample_params(batch, states, "a", False) == expect("a")
    states["b"].output_token_ids.append(12)
    states["a"].output_token_ids.append(13)

    # Step 3, nothing added or removed: a now decodes and is swapped in front of c.
    step(m, batch, {"a": 1, "c": 8, "b": 1}, {"a": 32, "c": 24, "b": 5})
    assert batch.req_ids == ["b", "a", "c"]
    assert sample_params(batch, states, "b", False) == expect("b")
    assert sample_params(batch, states, "a", False) == expect("a")
    assert sample_params(batch, states, "c", False) == expect("c")


def test_prefill_moved_while_unsampled_gets_its_own_rows(mods):
    """A chunked prefill is moved by the decodes-first reordering in a step where the batch
    changed but it makes no logits; the next step (batch unchanged) it is sampled."""
    m = mods
    batch = make_batch(m)
    states = {
        "a": add(m, batch, "a", [1] * 32, temperature=0.25, top_k=3),
        "b": add(m, batch, "b", [3] * 4, temperature=1.75, top_k=6),
    }
    batch.refresh_sampling_metadata()
    step(m, batch, {"a": 16, "b": 4}, {})  # a: first chunk, no logits; b sampled
    assert sample_params(batch, states, "b", True)[:2] == (1.75, 6)
    states["b"].output_token_ids.append(21)

    # Step 2: e joins (batch changed). b decodes and is swapped in front of a; a's second
    # chunk makes no logits, so a is not sampled in this step.
    states["e"] = add(m, batch, "e", [5] * 40, temperature=0.6, top_k=4)
    batch.refresh_sampling_metadata()
    step(m, batch, {"a": 8, "b": 1, "e": 16}, {"a": 16, "b": 4})
    assert batch.req_ids == ["b", "a", "e"]
    assert sample_params(batch, states, "b", True)[:2] == (1.75, 6)
    states["b"].output_token_ids.append(22)

    # Step 3, nothing added or removed: a's last chunk completes and a is sampled.
    step(m, batch, {"a": 8, "b": 1, "e": 16}, {"a": 24, "b": 5, "e": 16})
    assert batch.req_ids == ["b", "a", "e"]
    assert sample_params(batch, states, "a", False)[:2] == (0.25, 3)
    assert sample_params(batch, states, "b", False)[:2] == (1.75, 6)
