"""Bad words are applied to the logits row of the request that asked for them, in every
HPU sampling call (decode batch, each prefill batch)."""

import functools
from types import SimpleNamespace

import pytest

VOCAB = 16
TOKEN = 7  # the token every request's logits favour


@pytest.fixture()
def mods(tree, monkeypatch):
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.sampler import Sampler
    import vllm_gaudi.utils as gaudi_utils
    import vllm_gaudi.v1.worker.hpu_input_batch as hib

    # Hardware only: the real row update, with the "device" tensors on the CPU.
    monkeypatch.setattr(hib, "async_h2d_update", functools.partial(gaudi_utils.async_h2d_update, device="cpu"))
    return SimpleNamespace(torch=torch, SamplingParams=SamplingParams, Sampler=Sampler, hib=hib)


def make_batch(m, requests):
    batch = m.hib.InputBatch(max_num_reqs=8, max_model_len=64, max_num_batched_tokens=64,
                             device=m.torch.device("cpu"), pin_memory=False, vocab_size=VOCAB,
                             block_sizes=[16], kernel_block_sizes=[16])
    states = {}
    for rid, bad in requests:
        sp = m.SamplingParams(temperature=0.0)
        if bad:
            # What SamplingParams.update_from_tokenizer stores for `bad_words`.
            sp._bad_words_token_ids = bad
        states[rid] = m.hib.CachedRequestState(req_id=rid, prompt_token_ids=[1, 2, 3], mm_features=[],
                                               sampling_params=sp, generator=None, block_ids=[[0]],
                                               num_computed_tokens=0, output_token_ids=[])
        batch.add_request(states[rid])
    batch.refresh_sampling_metadata()
    return batch, states


def sample(m, batch, states, rids):
    """One HPU sampling call: the rows are the requests in `rids`, in that order."""
    md = batch.make_selective_sampling_metadata([(r, states[r].output_token_ids) for r in rids])
    logits = m.torch.zeros(len(rids), VOCAB)
    logits[:, TOKEN] = 10.0
    logits[:, TOKEN + 1] = 5.0
    out = m.Sampler()(logits, md)
    return dict(zip(rids, out.sampled_token_ids.flatten().tolist()))


def test_other_requests_bad_words_do_not_mask_this_row(mods):
    m = mods
    batch, states = make_batch(m, [("a", [[TOKEN]]), ("b", None)])
    # A prefill batch that holds only b (a is decoding in its own call).
    assert sample(m, batch, states, ["b"]) == {"b": TOKEN}
    assert sample(m, batch, states, ["a"]) == {"a": TOKEN + 1}


@pytest.mark.red_raises("IndexError")
def test_bad_words_of_a_later_request_in_a_smaller_call(mods):
    """a sits at batch index 2 but is row 0 of its sampling call: on the pristine tree the
    sampler indexes logits row 2 of a one-row tensor (IndexError, engine stops)."""
    m = mods
    batch, states = make_batch(m, [("x", None), ("y", None), ("a", [[TOKEN]])])
    assert sample(m, batch, states, ["a"]) == {"a": TOKEN + 1}
    assert sample(m, batch, states, ["y", "a"]) == {"y": TOKEN, "a": TOKEN + 1}
    assert sample(m, batch, states, ["x", "y"]) == {"x": TOKEN, "y": TOKEN}


@pytest.mark.red_raises("IndexError")
def test_multi_token_bad_word_uses_this_requests_history(mods):
    m = mods
    batch, states = make_batch(m, [("x", None), ("a", [[4, TOKEN]])])
    states["a"].output_token_ids.append(4)  # a just produced the prefix of its bad word
    assert sample(m, batch, states, ["a"]) == {"a": TOKEN + 1}
    assert sample(m, batch, states, ["x"]) == {"x": TOKEN}
