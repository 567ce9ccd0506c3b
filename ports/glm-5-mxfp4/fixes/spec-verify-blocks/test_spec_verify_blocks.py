"""spec-verify-blocks: under speculative decoding each verify row of a decode batch gets the
block list of its own position (HPUModelRunner's real _create_decode_input_data and
get_habana_paged_attn_buffers on CPU; only the host-to-device copy is taken out, and the
bucketing manager gives the sizes asked for). The flat paged attention reads, for row r, the
blocks whose group is r, each up to its usage; the last block must hold the row's own slot."""

from unittest.mock import MagicMock

import pytest

from packtests.sampling_runner import sampling_env

BLOCK = 4
TABLE = [10, 11, 12, 13]  # the request's KV blocks (the block table row), 4 tokens each


@pytest.fixture()
def env(tree, monkeypatch):
    e = sampling_env(monkeypatch)
    torch = e.torch

    def to_host(t, device=None, dtype=None, **kwargs):  # hardware: the copy to the card
        t = torch.as_tensor(t)
        return t if dtype is None else t.to(dtype)

    monkeypatch.setattr(e.hmr, "async_h2d_copy", to_host)
    return e


def decode_rows(e, requests):
    """requests: {req_id: (context_len, drafts)}, in batch order. Returns, per verify row of
    the real requests, the {block: usage} the attention metadata gives it, and its slot."""
    torch = e.torch
    R = e.hmr.HPUModelRunner
    r = MagicMock()
    for name in (
        "_create_decode_input_data",
        "get_habana_paged_attn_buffers",
        "_prepare_spec_decode_inputs",
        "_get_cumsum_and_arange",
        "_resolve_block",
        "_resolve_all_blocks",
    ):
        setattr(r, name, getattr(R, name).__get__(r))
    r.defragmenter = None
    r.attn_block_size = BLOCK
    r.bucketing_manager.find_decode_bucket.side_effect = lambda bs, blocks, *a: (max(bs, 4), 0, max(blocks, 1))
    r.get_dp_padding.return_value = 0
    r.use_contiguous_pa = False  # the default: vllm-gaudi disables it with prefix caching
    r._PAD_BLOCK_ID = 99
    r.interleaved_sliding_window = False
    r.model_has_chunked_attention = False
    r.num_mamba_like_layers = 0
    r.uses_mrope = False
    r.pin_memory = False
    r.use_async_scheduling = False
    r.model_config.dtype = torch.float32
    r.device = "cpu"
    r.arange_np = e.np.arange(256)
    r.input_batch.req_id_to_index = {rid: i for i, rid in enumerate(requests)}
    positions, scheduled = [], []
    for ctx, drafts in requests.values():
        positions += [ctx + t for t in range(1 + len(drafts))]
        scheduled.append(1 + len(drafts))
    r.positions_cpu = torch.tensor(positions + [0] * 16)
    r.input_ids_cpu = torch.zeros(len(positions) + 16, dtype=torch.int64)
    so = MagicMock()
    so.scheduled_spec_decode_tokens = {rid: drafts for rid, (_, drafts) in requests.items() if drafts}
    table = torch.tensor([TABLE] * len(requests))
    contexts = e.np.array([ctx for ctx, _ in requests.values()])
    md = r._create_decode_input_data(len(requests), scheduled, contexts, table, so).attn_metadata
    width = max(scheduled)
    slots = md.slot_mapping.view(-1).tolist()
    rows = {}
    for b, (rid, (_, drafts)) in enumerate(requests.items()):
        for t in range(1 + len(drafts)):
            row = b * width + t
            got = {
                int(blk): int(use)
                for blk, grp, use in zip(
                    md.block_list.tolist(), md.block_groups.tolist(), md.block_usage.tolist(), strict=True
                )
                if grp == row
            }
            rows[(rid, t)] = (got, slots[row])
    return rows


def expected(position):
    """The blocks a token at `position` attends to: every block up to its own, full, then its
    own up to and including its slot."""
    last = position // BLOCK
    return {TABLE[j]: BLOCK if j < last else position % BLOCK + 1 for j in range(last + 1)}


def test_a_draft_row_past_the_last_block_of_the_context_sees_its_own_block(env):
    # context 3: the last sampled token is at position 3 (block 10's last slot); the two drafts
    # are at positions 4 and 5, in block 11
    rows = decode_rows(env, {"a": (3, [8, 9]), "b": (9, [5, 6])})
    for (rid, t), (got, slot) in rows.items():
        position = {"a": 3, "b": 9}[rid] + t
        assert slot == TABLE[position // BLOCK] * BLOCK + position % BLOCK, (rid, t)
        assert got == expected(position), (rid, t, got)


def test_rows_within_the_context_s_last_block_keep_their_blocks(env):
    """A decode without drafts, and drafts that stay in the block of the context's last token,
    get the blocks they got before (the fix changes nothing there)."""
    rows = decode_rows(env, {"a": (8, [1, 2]), "b": (5, [])})
    assert rows[("a", 0)][0] == expected(8) and rows[("a", 2)][0] == expected(10)
    assert rows[("b", 0)][0] == expected(5)
