"""min_p, logit_bias and min_tokens (vLLM's builtin logits processors, which vllm-gaudi
builds) take effect on HPU, for the request that asked for them, in every sampling call:
across chunked prefills, reorders (swaps), removals with slot reuse and condensing."""

import functools
from types import SimpleNamespace

import pytest

VOCAB = 16
TOP = 7  # the token every row's logits favour


@pytest.fixture()
def mods(tree, monkeypatch):
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor, MinPLogitsProcessor,
                                                         MinTokensLogitsProcessor)
    from vllm.v1.sample.sampler import Sampler
    import vllm.utils.torch_utils as torch_utils
    import vllm_gaudi.utils as gaudi_utils
    import vllm_gaudi.v1.worker.hpu_input_batch as hib

    # Hardware only: the real row update, with the "device" tensors on the CPU; and no pinned
    # host memory (vLLM's platform probe says yes on this CPU-only machine, torch says no).
    monkeypatch.setattr(hib, "async_h2d_update", functools.partial(gaudi_utils.async_h2d_update, device="cpu"))
    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)

    def processors():
        # What build_logitsprocs(vllm_config, device, ...) gives a generative model: the three
        # builtins (it reads only scheduler_config.max_num_seqs from the config).
        cfg = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8))
        dev = torch.device("cpu")
        return LogitsProcessors([MinPLogitsProcessor(cfg, dev, False), LogitBiasLogitsProcessor(cfg, dev, False),
                                 MinTokensLogitsProcessor(cfg, dev, False)])

    return SimpleNamespace(torch=torch, SamplingParams=SamplingParams, Sampler=Sampler, hib=hib,
                           processors=processors)


class Batch:
    """An InputBatch driven the way HPUModelRunner._update_states drives it."""

    def __init__(self, m):
        self.m = m
        self.b = m.hib.InputBatch(max_num_reqs=8, max_model_len=64, max_num_batched_tokens=64,
                                  device=m.torch.device("cpu"), pin_memory=False, vocab_size=VOCAB,
                                  block_sizes=[16], kernel_block_sizes=[16], logitsprocs=m.processors())
        self.states = {}

    def step(self, add=(), remove=()):
        removed = sorted((self.b.remove_request(r) for r in remove), reverse=True)
        for rid, sp in add:
            self.states[rid] = self.m.hib.CachedRequestState(
                req_id=rid, prompt_token_ids=[1, 2, 3], mm_features=[], sampling_params=self.m.SamplingParams(**sp),
                generator=None, block_ids=[[0]], num_computed_tokens=0, output_token_ids=[])
            self.b.add_request(self.states[rid], removed.pop() if removed else None)
        if removed:
            self.b.condense(removed)
        if add or remove:
            self.b.refresh_sampling_metadata()

    def sample(self, rids, logits=None, pad_to=None):
        """One HPU sampling call over `rids` (padded like the decode batch)."""
        lst = [(r, self.states[r].output_token_ids) for r in rids]
        while pad_to and len(lst) < pad_to:
            lst.append(lst[0])
        md = self.b.make_selective_sampling_metadata(lst)
        if logits is None:
            logits = self.m.torch.zeros(len(lst), VOCAB)
            logits[:, TOP] = 10.0
            logits[:, TOP + 1] = 9.0
        out = self.m.Sampler()(logits, md).sampled_token_ids.flatten().tolist()
        for (r, _), tok in zip(lst[:len(rids)], out):
            self.states[r].output_token_ids.append(tok)  # what sample_tokens does
        return dict(zip(rids, out))


def test_logit_bias_applies_to_its_own_request(mods):
    bt = Batch(mods)
    bt.step(add=[("x", dict(temperature=0.0)), ("y", dict(temperature=0.0)),
                 ("a", dict(temperature=0.0, logit_bias={3: 100.0}))])
    # a is at batch index 2 but row 0 of its (prefill) call; x and y decode in their own call.
    assert bt.sample(["a"]) == {"a": 3}
    assert bt.sample(["x", "y"], pad_to=4) == {"x": TOP, "y": TOP}
    # Decodes first: a is swapped to index 0 in a step where nothing was added or removed.
    bt.b.swap_states(0, 2)
    assert bt.sample(["a", "y"], pad_to=4) == {"a": 3, "y": TOP}
    assert bt.sample(["x"]) == {"x": TOP}


def test_min_tokens_holds_back_stop_tokens_until_reached(mods):
    bt = Batch(mods)
    bt.step(add=[("x", dict(temperature=0.0)), ("a", dict(temperature=0.0, min_tokens=2, stop_token_ids=[TOP]))])
    assert bt.sample(["a", "x"]) == {"a": TOP + 1, "x": TOP}
    assert bt.sample(["a", "x"]) == {"a": TOP + 1, "x": TOP}
    # Two tokens generated: the stop token is allowed again.
    assert bt.sample(["a", "x"]) == {"a": TOP, "x": TOP}


def test_removed_requests_state_does_not_leak_into_a_reused_slot(mods):
    bt = Batch(mods)
    bt.step(add=[("a", dict(temperature=0.0, logit_bias={3: 100.0})), ("x", dict(temperature=0.0)),
                 ("b", dict(temperature=0.0, logit_bias={5: 100.0}))])
    assert bt.sample(["a", "x", "b"]) == {"a": 3, "x": TOP, "b": 5}
    # a finishes, c takes its slot (index 0); x is unscheduled; b is condensed down.
    bt.step(add=[("c", dict(temperature=0.0))], remove=["a", "x"])
    assert bt.b.req_ids == ["c", "b"]
    assert bt.sample(["c", "b"]) == {"c": TOP, "b": 5}
    # x is scheduled again (re-added) and keeps no bias; b's bias follows b.
    bt.step(add=[("x", dict(temperature=0.0))])
    assert bt.sample(["x"]) == {"x": TOP}
    assert bt.sample(["b", "c"]) == {"b": 5, "c": TOP}


def test_a_finished_request_leaves_no_state_behind(mods):
    bt = Batch(mods)
    bt.step(add=[("x", dict(temperature=0.0)), ("y", dict(temperature=0.0)),
                 ("b", dict(temperature=0.0, logit_bias={5: 100.0}))])
    assert bt.sample(["x", "y", "b"]) == {"x": TOP, "y": TOP, "b": 5}
    # b (the last index: nothing is condensed into its slot) finishes; its bias must go with it.
    bt.step(remove=["b"])
    assert bt.b.req_ids == ["x", "y"]
    assert bt.sample(["y", "x"]) == {"y": TOP, "x": TOP}


def test_min_p_filters_unlikely_tokens_for_its_request(mods):
    m = mods
    bt = Batch(m)
    bt.step(add=[("x", dict(temperature=0.0)), ("a", dict(temperature=1.0, min_p=0.5))])
    m.torch.manual_seed(0)
    # Row 0 of each call is a: token TOP+1 has a quarter of TOP's probability, below min_p.
    logits = m.torch.full((1, VOCAB), -30.0)
    logits[0, TOP] = 10.0
    logits[0, TOP + 1] = 10.0 - float(m.torch.log(m.torch.tensor(4.0)))
    seen = {bt.sample(["a"], logits=logits.clone())["a"] for _ in range(64)}
    assert seen == {TOP}
