"""Image embeddings of non-M-RoPE models are merged with index_copy_ at positions built on
the host, giving exactly the masked_scatter_ result; the model still receives its bool mask.

The real HPUModelRunner._gather_mm_embeddings builds the mask (and the index) from real
request states, and a small SupportsMultiModal model runs vLLM's own embed_input_ids, which
reaches vllm-gaudi's _merge_multimodal_embeddings (the function in effect on HPU)."""

import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

H = 8
VOCAB = 64


def _model_class():
    from vllm.model_executor.models.interfaces import SupportsMultiModal

    class TinyVLM(nn.Module, SupportsMultiModal):
        """Only the token embedding is model-specific; embed_input_ids is vLLM's default."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, H)

        def get_language_model(self):
            return SimpleNamespace(embed_input_ids=self.embed)

    return TinyVLM


def _random_step(seed):
    """A prefill step of 1-3 requests with images at random places, some only partly in
    the chunk, some with non-embedding placeholder positions (is_embed)."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    rng = random.Random(seed)
    requests, encoder_cache, scheduled = {}, {}, {}
    for r in range(rng.randint(1, 3)):
        prompt_len = rng.randint(24, 60)
        features, pos = [], rng.randint(0, 4)
        while True:
            length = rng.randint(1, 9)
            if pos + length > prompt_len:
                break
            is_embed = None
            if rng.random() < 0.4:
                is_embed = torch.tensor([rng.random() < 0.7 for _ in range(length)])
                is_embed[0] = True
            ident = f"img-{seed}-{r}-{pos}"
            features.append(
                MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                      mm_position=PlaceholderRange(offset=pos, length=length, is_embed=is_embed)))
            # The runner caches one row per placeholder position (NaN where no embedding).
            out = torch.randn(length, H, dtype=torch.float32)
            if is_embed is not None:
                out[~is_embed] = float("nan")
            encoder_cache[ident] = out
            pos += length + rng.randint(0, 6)
        computed = rng.choice([0, 0, rng.randint(1, prompt_len // 2)])
        req_id = f"req-{r}"
        requests[req_id] = CachedRequestState(
            req_id=req_id, prompt_token_ids=[rng.randrange(VOCAB) for _ in range(prompt_len)], mm_features=features,
            sampling_params=SamplingParams(), generator=None, block_ids=([0], ), num_computed_tokens=computed,
            output_token_ids=[])
        scheduled[req_id] = prompt_len - computed
    return requests, encoder_cache, scheduled


def _runner(requests, encoder_cache):
    from vllm.v1.utils import CpuGpuBuffer
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

    runner = object.__new__(HPUModelRunner)  # the real class; only the fields this path reads are set
    runner.device = torch.device("cpu")
    runner.uses_mrope = False  # e.g. Gemma 3, InternVL, GLM-5.3-Flash (NoPE)
    runner.is_mm_embed = CpuGpuBuffer(512, dtype=torch.bool, device=runner.device, pin_memory=False, with_numpy=True)
    runner.requests = requests
    runner.encoder_cache = encoder_cache
    return runner


def _merge_step(seed, spy, padded=False):
    import vllm_gaudi.models.utils  # noqa: F401  (installs the HPU merge, as the plugin does)

    requests, encoder_cache, scheduled = _random_step(seed)
    runner = _runner(requests, encoder_cache)
    req_ids = list(requests)
    chunks = [requests[rid].prompt_token_ids[requests[rid].num_computed_tokens:] for rid in req_ids]
    if padded:
        # 2D prefill batch [batch, padded_seq_len], as _get_model_mm_inputs lays it out.
        seq = max(map(len, chunks)) + 3
        input_ids = torch.tensor([c + [0] * (seq - len(c)) for c in chunks])
        total = input_ids.numel()
        kwargs = dict(total_num_scheduled_tokens=total, padded_seq_len=seq)
    else:
        input_ids = torch.tensor([t for c in chunks for t in c])
        total = input_ids.numel()
        kwargs = {}
    sched = SimpleNamespace(total_num_scheduled_tokens=sum(scheduled.values()), num_scheduled_tokens=scheduled)
    mm_embeds, is_mm_embed = runner._gather_mm_embeddings(sched, req_ids, **kwargs)
    if not mm_embeds:
        pytest.skip("layout without images in the chunk")
    assert is_mm_embed.dtype == torch.bool and is_mm_embed.shape == (total, )

    torch.manual_seed(seed)
    model = _model_class()()
    with spy():
        merged = model.embed_input_ids(input_ids, multimodal_embeddings=mm_embeds, is_multimodal=is_mm_embed)

    expected = model.embed.weight[input_ids.reshape(-1)].detach().clone()
    expected.masked_scatter_(is_mm_embed.unsqueeze(-1), torch.cat(mm_embeds))
    return merged.detach(), expected.view(*input_ids.shape, H)


class _MaskedScatterSpy:
    """Counts masked_scatter_ calls (the merge that lowers to a dynamic nonzero on HPU)."""

    def __init__(self, monkeypatch):
        self.monkeypatch, self.calls = monkeypatch, 0

    def __call__(self):
        spy = self
        orig = torch.Tensor.masked_scatter_

        def counting(t, mask, source):
            spy.calls += 1
            return orig(t, mask, source)

        class _Ctx:

            def __enter__(self):
                spy.monkeypatch.setattr(torch.Tensor, "masked_scatter_", counting)

            def __exit__(self, *exc):
                spy.monkeypatch.setattr(torch.Tensor, "masked_scatter_", orig)

        return _Ctx()


@pytest.mark.parametrize("padded", [False, True], ids=["flat", "padded-2d"])
@pytest.mark.parametrize("seed", range(8))
def test_index_merge_equals_masked_merge(tree, seed, padded, monkeypatch):
    merged, expected = _merge_step(seed, _MaskedScatterSpy(monkeypatch), padded)
    assert not torch.isnan(merged).any(), "a non-embedding placeholder row was merged"
    assert torch.equal(merged, expected)


@pytest.mark.parametrize("padded", [False, True], ids=["flat", "padded-2d"])
@pytest.mark.parametrize("seed", range(8))
def test_runner_mask_is_merged_without_masked_scatter(tree, seed, padded, monkeypatch):
    spy = _MaskedScatterSpy(monkeypatch)
    merged, expected = _merge_step(seed, spy, padded)
    assert torch.equal(merged, expected)
    assert spy.calls == 0, "image embeddings were merged with masked_scatter_ on the bool mask"


def test_mask_a_model_derives_itself_keeps_the_masked_merge(tree):
    """A mask that is not the runner's (a model deriving a sub-mask) is merged as before."""
    import vllm_gaudi.models.utils as hpu_utils

    inputs = torch.zeros(10, H)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[2, 3, 7]] = True
    embeds = [torch.ones(3, H)]
    mask.hpu_mm_index = torch.tensor([2, 3, 7])  # as the runner attaches it to its own mask
    derived = mask.clone()
    derived[7] = False
    out = hpu_utils._merge_multimodal_embeddings(inputs.clone(), [torch.ones(2, H)], derived)
    assert out[[2, 3]].eq(1).all() and out[7].eq(0).all()
    out = hpu_utils._merge_multimodal_embeddings(inputs.clone(), embeds, mask)
    assert out[[2, 3, 7]].eq(1).all() and out.sum() == 3 * H
