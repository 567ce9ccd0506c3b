"""A seeded request produces the same tokens whatever decode bucket (padding) it is sampled
in: its generator is drawn from once per step."""

import functools
from types import SimpleNamespace

import pytest

VOCAB = 64


@pytest.fixture()
def env(tree, monkeypatch):
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.sampler import Sampler
    import vllm_gaudi.utils as gaudi_utils
    import vllm_gaudi.v1.worker.hpu_input_batch as hib
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

    # Hardware only: the real row update, with the "device" tensors on the CPU.
    monkeypatch.setattr(hib, "async_h2d_update", functools.partial(gaudi_utils.async_h2d_update, device="cpu"))
    return SimpleNamespace(torch=torch, SamplingParams=SamplingParams, Sampler=Sampler, hib=hib,
                           HPUModelRunner=HPUModelRunner)


def seeded_stream(e, others, pad_to, steps=6):
    """Tokens of the seeded request "s" (first decode, so it is the one padding repeats)."""
    torch = e.torch
    batch = e.hib.InputBatch(max_num_reqs=8, max_model_len=64, max_num_batched_tokens=64,
                             device=torch.device("cpu"), pin_memory=False, vocab_size=VOCAB,
                             block_sizes=[16], kernel_block_sizes=[16])
    requests = {}
    for rid in ["s"] + others:
        sp = e.SamplingParams(temperature=1.0, seed=1234) if rid == "s" else e.SamplingParams(temperature=1.0)
        gen = None
        if rid == "s":
            # What HPUModelRunner._update_states creates for a SamplingType.RANDOM_SEED request.
            gen = torch.Generator(device="cpu")
            gen.manual_seed(sp.seed)
        requests[rid] = e.hib.CachedRequestState(req_id=rid, prompt_token_ids=[1, 2, 3], mm_features=[],
                                                 sampling_params=sp, generator=gen, block_ids=[[0]],
                                                 num_computed_tokens=3, output_token_ids=[])
        batch.add_request(requests[rid])
    batch.refresh_sampling_metadata()
    runner = SimpleNamespace(requests=requests)
    rids = ["s"] + others
    tokens = []
    torch.manual_seed(0)
    for step in range(steps):
        # The decode call: HPUModelRunner pads its request list to the decode bucket.
        lst = e.HPUModelRunner._generate_req_id_output_token_ids_lst(runner, rids, pad_to=pad_to)
        md = batch.make_selective_sampling_metadata(lst, skip_copy=step > 0)
        logits = torch.zeros(len(lst), VOCAB)
        tok = e.Sampler()(logits, md).sampled_token_ids.flatten().tolist()
        tokens.append(tok[0])
        for rid, t in zip(rids, tok):
            requests[rid].output_token_ids.append(t)
    return tokens


def test_seeded_stream_does_not_depend_on_decode_padding(env):
    alone = seeded_stream(env, [], pad_to=1)
    assert seeded_stream(env, [], pad_to=4) == alone
    assert seeded_stream(env, ["x", "y"], pad_to=4) == alone
    assert seeded_stream(env, ["x"], pad_to=8) == alone
