"""mtp-output-tuple: vllm-gaudi's draft proposer takes a DeepSeek-style MTP model's output pair
(pre-norm hidden for the logits, post-norm hidden to recycle) as vLLM says it returns it.

The proposer is the real ``HpuEagleProposer.propose`` of the tree; only its model is a small
stand-in with the output contract of vLLM's ``DeepSeekMTP.forward`` (``return hidden_states,
self.shared_head(hidden_states)``), and its attention metadata is not needed (it is passed
through to the model, which ignores it)."""

from types import SimpleNamespace

import pytest

HIDDEN, VOCAB = 8, 16


class PairMTP:
    """Returns (pre, post): ``pre`` gives the logits, ``post`` (a different tensor: the final
    norm applied) is what the next draft step takes as its previous hidden state."""

    def __init__(self, torch):
        self.torch = torch
        g = torch.Generator().manual_seed(0)
        self.head = torch.randn(HIDDEN, VOCAB, generator=g)
        self.calls = []

    def __call__(self, input_ids, positions, hidden_states, inputs_embeds=None, attn_metadata=None):
        self.calls.append(hidden_states.clone())
        t = self.torch
        emb = (
            t.nn.functional.one_hot(input_ids.reshape(-1).long() % HIDDEN, HIDDEN)
            .to(t.float32)
            .reshape(*input_ids.shape, HIDDEN)
        )
        pre = hidden_states + emb
        post = pre / (pre.norm(dim=-1, keepdim=True) + 1.0)
        return pre, post

    def compute_logits(self, h):
        return h @ self.head


def proposer(tree, model, num_tokens, architectures):
    from vllm_gaudi.v1.spec_decode.hpu_eagle import HpuEagleProposer

    p = object.__new__(HpuEagleProposer)  # no engine: the state propose() reads, set by hand
    p.method = "mtp"
    p.model = model
    p.num_speculative_tokens = num_tokens
    p.max_model_len = 1024
    p.hidden_size = HIDDEN
    p.draft_model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=architectures))
    p.prepare_attn_metadata = lambda *args: None
    return p


def inputs(torch):
    g = torch.Generator().manual_seed(1)
    return dict(
        target_token_ids=torch.tensor([[3], [5]]),
        target_positions=torch.tensor([[7], [9]]),
        target_hidden_states=torch.randn(2, 1, HIDDEN, generator=g),
        last_token_indices=torch.tensor([0, 1]),
        common_attn_metadata=None,
        block_table_cpu_tensor=None,
        model_runner=None,
    )


@pytest.mark.red_raises("AttributeError")
def test_one_draft_token_comes_from_the_pre_norm_hidden_of_the_pair(tree):
    import torch

    model = PairMTP(torch)
    x = inputs(torch)
    draft = proposer(tree, model, 1, ["DeepSeekMTPModel"]).propose(**x)
    pre, _ = model(x["target_token_ids"], x["target_positions"], x["target_hidden_states"])
    assert draft.tolist() == model.compute_logits(pre.view(-1, HIDDEN)).argmax(-1).view(-1, 1).tolist()


@pytest.mark.red_raises("AttributeError")
def test_later_draft_steps_recycle_the_post_norm_hidden(tree):
    import torch

    model = PairMTP(torch)
    x = inputs(torch)
    draft = proposer(tree, model, 3, ["DeepSeekMTPModel"]).propose(**x)
    assert draft.shape == (2, 3)
    # step 2 is fed the post-norm element of step 1's pair, step 3 that of step 2's
    for k in (1, 2):
        fed = model.calls[k].view(-1, HIDDEN)
        prev_in = model.calls[k - 1]
        ids = x["target_token_ids"] if k == 1 else draft[:, k - 2].view(-1, 1).int()
        _, post = PairMTP(torch)(ids, None, prev_in)
        assert torch.equal(fed, post.view(-1, HIDDEN)), k
        # and its token is the argmax of the logits of the pre-norm element
        pre, _ = PairMTP(torch)(draft[:, k - 1].view(-1, 1).int(), None, fed.view(-1, 1, HIDDEN))
        assert draft[:, k].tolist() == model.compute_logits(pre.view(-1, HIDDEN)).argmax(-1).tolist()


def test_an_mtp_model_that_returns_one_tensor_keeps_the_old_path(tree):
    """A draft model vLLM does not list as returning a pair still gets one tensor taken whole,
    and the target's hidden state recycled (what vllm-gaudi did before)."""
    import torch

    class OneTensor(PairMTP):
        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs)[0]

    model = OneTensor(torch)
    x = inputs(torch)
    draft = proposer(tree, model, 2, ["SomeOtherMTPModel"]).propose(**x)
    assert draft.shape == (2, 2)
    assert torch.equal(model.calls[1].view(-1, HIDDEN), x["target_hidden_states"].view(-1, HIDDEN))
