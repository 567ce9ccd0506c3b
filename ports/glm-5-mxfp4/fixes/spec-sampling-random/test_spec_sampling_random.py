"""spec-sampling-random: under speculative decoding a request sampled at temperature > 0 is
verified by rejection sampling on HPU (vllm-gaudi's torch ops under vLLM's RejectionSampler),
beside greedy requests, instead of stopping the engine.

The first test drives HPUModelRunner's real sample_tokens (packtests.sampling_runner: the real
spec-decode metadata, vLLM's RejectionSampler with vllm-gaudi's ops). The others call vLLM's
RejectionSampler directly, with the ops vllm-gaudi registers, on the verify-row layout
HPUModelRunner._prepare_spec_decode_inputs makes (the first test drives that function), to
check the distribution of what it emits over many requests."""

import pytest

from packtests.sampling_runner import add, make_runner, run_step, sampling_env


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


@pytest.mark.red_raises("RuntimeError")
def test_a_request_above_temperature_0_is_verified_beside_a_greedy_one(env):
    e = env
    # each request's target has one possible token per verify position (probability 1)
    favourite = {"g": [5, 6, 7], "r": [9, 10, 11], "s": [12, 13, 14]}
    runner = make_runner(e, favourite, num_spec_tokens=2, certain=True)
    add(e, runner, "g", 4, temperature=0.0)
    add(e, runner, "r", 4, temperature=0.8, top_k=20, top_p=0.9)
    add(e, runner, "s", 4, temperature=1.3, seed=7)
    runner.input_batch.refresh_sampling_metadata()
    assert run_step(e, runner, {"g": 4, "r": 4, "s": 4}, {}, batch_changed=True) == {"g": [5], "r": [9], "s": [12]}
    # g: both drafts right, then the bonus token; r: the second draft wrong, replaced by the
    # target's token; s: the first draft wrong
    out = run_step(
        e,
        runner,
        {"g": 3, "r": 3, "s": 3},
        {"g": 4, "r": 4, "s": 4},
        drafts={"g": [5, 6], "r": [9, 3], "s": [1, 13]},
        batch_changed=True,
    )
    assert out == {"g": [5, 6, 7], "r": [9, 10], "s": [12]}


def verify(e, target, drafts, n, temperature=1.0, seeds=None):
    """n requests, each verifying ``drafts`` against the distribution ``target`` (at every
    verify row and the bonus row), through vLLM's RejectionSampler with vllm-gaudi's ops.
    Returns the emitted tokens, [n, len(drafts) + 1], -1 where none."""
    import torch
    import vllm_gaudi.v1.sample.hpu_rejection_sampler  # noqa: F401  (register_ops() imports it on HPU)
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    k, vocab = len(drafts), len(target)
    width = k + 1
    logits = torch.tensor(target, dtype=torch.float32).log().repeat(n * width, 1)
    # _prepare_spec_decode_inputs' layout: rows b*width .. b*width+k-1 verify request b's drafts,
    # row b*width+k is its bonus row; the drafts come as the [n*k, 1] token ids after them
    meta = SpecDecodeMetadata(
        draft_token_ids=torch.tensor(drafts * n).view(-1, 1),
        num_draft_tokens=[k] * n,
        cu_num_draft_tokens=torch.arange(1, n + 1, dtype=torch.int32) * k,
        cu_num_sampled_tokens=torch.arange(1, n + 1, dtype=torch.int32) * width,
        target_logits_indices=torch.tensor([b * width + i for b in range(n) for i in range(k)]),
        bonus_logits_indices=torch.tensor([b * width + k for b in range(n)]),
        logits_indices=torch.arange(n * width),
    )
    sampling = SamplingMetadata(
        temperature=torch.full((n,), temperature),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={i: torch.Generator().manual_seed(s) for i, s in (seeds or {}).items()},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
    from vllm.v1.sample.sampler import Sampler

    out = RejectionSampler(Sampler())(meta, None, logits, sampling).sampled_token_ids
    assert out.shape == (n, width) and vocab > 0
    return out


@pytest.mark.red_raises("TypeError")
def test_emitted_tokens_follow_the_target_distribution(env):
    """Rejection sampling's promise: whatever the drafts, each emitted token is distributed as
    the target. Draft 0 is accepted with probability p(0) = 0.4, else the token is drawn from
    the target without token 0; the second draft (token 3, p = 0.1) likewise."""
    import torch

    torch.manual_seed(0)
    target = [0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0]
    n = 6000
    out = verify(e=env, target=target, drafts=[0, 3], n=n)
    first = torch.bincount(out[:, 0].long(), minlength=8).double() / n
    assert torch.allclose(first, torch.tensor(target, dtype=torch.float64), atol=0.025), first
    # the row stops after the first rejection; after an accepted first draft, the second
    # token again follows the target, and a third (the bonus) exists only if both were kept
    kept = out[:, 0] == 0
    second = torch.bincount(out[kept, 1].long(), minlength=8).double() / int(kept.sum())
    assert torch.allclose(second, torch.tensor(target, dtype=torch.float64), atol=0.04), second
    assert (out[~kept, 1:] == -1).all()
    both = kept & (out[:, 1] == 3)
    assert (out[both, 2] >= 0).all() and (out[~both, 2] == -1).all()
    # tokens the target gives probability 0 are never emitted
    assert not (out[out >= 0] >= 4).any()


@pytest.mark.red_raises("TypeError")
def test_a_draft_the_target_never_samples_is_always_replaced(env):
    import torch

    torch.manual_seed(1)
    out = verify(e=env, target=[0.0, 0.5, 0.5, 0.0], drafts=[3, 1], n=500)
    assert set(out[:, 0].tolist()) == {1, 2} and (out[:, 1:] == -1).all()


@pytest.mark.red_raises("TypeError")
def test_a_seeded_request_verifies_the_same_way_every_time(env):
    import torch

    target = [0.25, 0.25, 0.25, 0.25]
    runs = []
    for rng in (3, 4):
        torch.manual_seed(rng)  # the unseeded requests' draws differ between the two runs
        runs.append(verify(e=env, target=target, drafts=[0, 1, 2], n=64, seeds={i: 1000 + i for i in range(0, 64, 2)}))
    assert torch.equal(runs[0][0::2], runs[1][0::2])
    assert not torch.equal(runs[0][1::2], runs[1][1::2])
