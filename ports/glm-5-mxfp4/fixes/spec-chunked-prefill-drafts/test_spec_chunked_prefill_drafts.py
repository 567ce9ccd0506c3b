"""spec-chunked-prefill-drafts: with chunked prefill, each prefill batch is drafted from its own
hidden states and its own sampled token, and the runner hands one draft row per request, in the
batch's order (HPUModelRunner's real propose_draft_token_ids and propose_eagle_prefill on CPU;
the drafter is a stand-in that writes down what it is given: the MTP layer itself runs in the
runner e2e, tests/e2e/test_vllm_gaudi_mtp_levers.py)."""

from unittest.mock import MagicMock

import pytest

from packtests.sampling_runner import sampling_env

TABLE_WIDTH = 4


@pytest.fixture()
def env(tree, monkeypatch):
    return sampling_env(monkeypatch)


def propose(e, batches, sampled):
    """batches: [(req_id, prompt_len, logits_rows)] in prefill order, one request per batch;
    a batch with 0 logits rows is a chunk that does not finish its prompt. sampled: one token
    per logits row, in batch order (what sample_tokens keeps: nothing for a batch without
    logits). Returns the draft rows per request id and the drafter's calls."""
    torch = e.torch
    hmr = e.hmr
    r = MagicMock()
    for name in ("propose_draft_token_ids", "propose_eagle_prefill"):
        setattr(r, name, getattr(hmr.HPUModelRunner, name).__get__(r))
    r.speculative_config.method = "mtp"
    r.speculative_config.use_eagle.return_value = True
    r.speculative_config.num_speculative_tokens = 1
    r.use_aux_hidden_state_outputs = False
    r.device = "cpu"
    # each request's block table row starts with its index in the input batch (times 10)
    table = torch.tensor([[10 * i + j for j in range(TABLE_WIDTH)] for i in range(len(batches))])
    r.input_batch.block_table = [MagicMock()]
    r.input_batch.block_table[0].get_cpu_tensor.return_value = table
    calls = []

    def drafter_propose(target_token_ids, positions, hidden, last_token_indices, attn_metadata, block_table, runner):
        # the draft of row i: its target token * 100 + the marker of the hidden state it was given
        rows = [int(target_token_ids[0, i]) * 100 + int(hidden[0, i, 0]) for i in last_token_indices.tolist()]
        calls.append({"tokens": target_token_ids[0].tolist(), "table": block_table.tolist()})
        return torch.tensor(rows, dtype=torch.int64).view(-1, 1)

    r.drafter = MagicMock(spec=hmr.EagleProposer)
    r.drafter.propose.side_effect = drafter_propose
    data = hmr.PrefillInputData()
    hidden = []
    for b, (rid, n, logits_rows) in enumerate(batches):
        data.request_ids.append([rid])
        data.prompt_lens.append(n)
        data.token_ids.append(torch.arange(1, n + 1, dtype=torch.int32).view(1, -1))  # as the runner's
        data.position_ids.append(torch.arange(n).view(1, -1))
        data.attn_metadata.append(None)
        data.logits_indices.append(torch.tensor([n - 1] * logits_rows, dtype=torch.int32))
        data.logits_requests.append([rid] * logits_rows)
        hidden.append(torch.full((n, 8), float(b + 1)))  # batch b's hidden states carry b + 1
    tensors = [torch.tensor([t], dtype=torch.int32) for t in sampled]  # vLLM's sampler gives int32
    drafts = r.propose_draft_token_ids(
        MagicMock(), [], None, None, None, None, tensors, None, hidden, None, None, 0, data, None
    )
    rows = drafts.tolist()
    assert len(rows) == len(batches), rows
    return {rid: row for (rid, _, _), row in zip(batches, rows, strict=True)}, calls


def test_a_chunk_without_logits_does_not_shift_the_other_batches_drafts(env):
    # the long prompt's first chunk (no logits), then three complete short prompts sampling 7, 8, 9
    batches = [("long", 6, 0), ("s1", 3, 1), ("s2", 4, 1), ("s3", 2, 1)]
    drafts, calls = propose(env, batches, [7, 8, 9])
    # each short prompt drafts from its own token (x 100) and its own batch's hidden states (b + 1);
    # the chunk's row is the placeholder (the scheduler drops drafts of a prefill chunk)
    assert drafts == {"long": [0], "s1": [702], "s2": [803], "s3": [904]}
    # each batch's drafter call gets its own block table rows
    assert [c["table"] for c in calls[1:]] == [[[10, 11, 12, 13]], [[20, 21, 22, 23]], [[30, 31, 32, 33]]]


@pytest.mark.red_raises("ValueError")
def test_a_step_of_only_a_chunk_hands_one_placeholder_row(env):
    drafts, _ = propose(env, [("long", 6, 0)], [])
    assert drafts == {"long": [0]}


def test_complete_prompts_keep_their_drafts(env):
    """Without a chunk every batch samples, and the drafts are those the runner made before."""
    drafts, _ = propose(env, [("s1", 3, 1), ("s2", 4, 1)], [7, 8])
    assert drafts == {"s1": [701], "s2": [802]}
