"""The pure pieces of GLM_DSA_SPARSE on vllm-gaudi's MLA path (glm5_hpu/hpu_dsa.py), on CPU
against glm5_hpu/dsa.py's rule (itself tested against transformers 5.23.0 in test_glm5_hpu_dsa.py):
the selection in vllm-gaudi's prefill layout (padded batch, context blocks) and decode layout
(flat blocks in any order, padding blocks), the biases they give, and the test-only threshold.
Through vllm-gaudi's runner on the emulation: tests/e2e/test_vllm_gaudi_dsa.py."""

from __future__ import annotations

import pytest
import torch

from glm5_hpu import dsa
from glm5_hpu.hpu_dsa import (
    SCORE_BUDGET,
    UNSELECTED,
    choose,
    decode_bias,
    index_scores,
    prefill_bias,
    row_bytes,
    score_rows,
    threshold,
)
from glm5_hpu.switches import SwitchError

NEG_INF = float("-inf")


def test_threshold_is_the_seed_unless_the_test_flag_allows_another():
    assert threshold({}) == dsa.DENSE_UNTIL_KEYS == 32768
    assert threshold({"GLM_DSA_TEST": "1", "GLM_DSA_TEST_THRESHOLD": "16"}) == 16
    with pytest.raises(SwitchError, match="GLM_DSA_TEST_THRESHOLD=16: a test-only setting.*GLM_DSA_TEST=1"):
        threshold({"GLM_DSA_TEST_THRESHOLD": "16"})
    for bad in ("0", "-3", "1.5", "many"):
        with pytest.raises(SwitchError, match=f"GLM_DSA_TEST_THRESHOLD={bad}: not a positive"):
            threshold({"GLM_DSA_TEST": "1", "GLM_DSA_TEST_THRESHOLD": bad})


def _scores(g, s, t, zeros=0.3):
    """Random scores with many exact zeros (relu's ties)."""
    x = torch.randn(s, t, generator=g)
    return torch.where(torch.rand(s, t, generator=g) < zeros, torch.zeros_like(x), x)


@pytest.mark.parametrize("thr", [4, 6, 20])
def test_choose_is_dsa_selects_rule_in_any_column_order(thr):
    g = torch.Generator().manual_seed(thr)
    s, topk = 20, 4
    scores, q_pos = _scores(g, s, s), torch.arange(s)
    want = dsa.select(scores, q_pos, topk, thr, sparse=True)
    visible = torch.arange(s)[None, :] <= q_pos[:, None]
    got = choose(scores, q_pos[None].expand(s, -1), visible, q_pos, topk, thr)
    assert torch.equal(got, want)
    assert (got.sum(-1)[q_pos + 1 > max(thr, topk)] == topk).all()
    # the keys in another order (as a block list gives them): the same keys, ties by position
    perm = torch.randperm(s, generator=g)
    got = choose(scores[:, perm], q_pos[perm][None].expand(s, -1), visible[:, perm], q_pos, topk, thr)
    assert torch.equal(got, want[:, perm])
    # negative control: another score order selects other keys
    other = choose(-scores, q_pos[None].expand(s, -1), visible, q_pos, topk, thr)
    if thr < s - 1:
        assert not torch.equal(other, want)


def test_index_scores_are_the_indexers():
    g = torch.Generator().manual_seed(1)
    q, w, keys = torch.randn(5, 3, 8, generator=g), torch.randn(5, 3, generator=g), torch.randn(7, 8, generator=g)
    per_head = torch.relu(torch.matmul(q, keys.t()) * 8**-0.5)
    got = index_scores(q.unsqueeze(0), w.unsqueeze(0), keys.unsqueeze(0), 8)[0]
    assert torch.allclose(got, torch.matmul(w.unsqueeze(-2), per_head).squeeze(-2), rtol=0, atol=1e-6)


def _attend(q, k, v, bias):
    """Plain softmax attention with an additive bias: q [S, d], k, v [L, d], bias [S, L]."""
    p = torch.softmax(q @ k.t() + bias, dim=-1)
    return p @ v


def test_prefill_bias_selects_as_dsa_with_context_padding_and_rows_below_left_bit_identical():
    """Two prompts in vllm-gaudi's prefill layout: context blocks (padded to the longer one) then
    this chunk (padded to T); the runner's bias; the selection's bias gives, for every real
    query, dsa.py's attention over the keys dsa.select keeps; a query at or below the threshold
    keeps the runner's bias bit for bit."""
    g = torch.Generator().manual_seed(2)
    topk, thr, bs, d, h = 5, 8, 4, 16, 2
    ctx_lens, seq_lens, t = [8, 4], [6, 3], 6
    b, nctx = 2, 2  # context blocks per prompt (padded)
    lk = nctx * bs + t
    bias = torch.full((b, 1, t, lk), NEG_INF)
    key_pos = torch.zeros(b, lk, dtype=torch.long)
    q_pos = torch.zeros(b, t, dtype=torch.long)
    for i, (c, n) in enumerate(zip(ctx_lens, seq_lens, strict=True)):
        key_pos[i, :c] = torch.arange(c)
        key_pos[i, nctx * bs : nctx * bs + n] = torch.arange(c, c + n)
        q_pos[i, :n] = torch.arange(c, c + n)
        for r in range(n):
            bias[i, 0, r, :c] = 0
            bias[i, 0, r, nctx * bs : nctx * bs + r + 1] = 0
    q, w, keys = (
        torch.randn(b, t, h, d, generator=g),
        torch.randn(b, t, h, generator=g),
        torch.randn(b, lk, d, generator=g),
    )
    got = prefill_bias(bias, q, w, keys, key_pos, q_pos, topk, thr, d)
    attn_q, attn_k, attn_v = (
        torch.randn(b, t, d, generator=g),
        torch.randn(b, lk, d, generator=g),
        torch.randn(b, lk, d, generator=g),
    )
    sparse_rows = 0
    for i, (c, n) in enumerate(zip(ctx_lens, seq_lens, strict=True)):
        cols = list(range(c)) + list(range(nctx * bs, nctx * bs + n))  # the sequence's keys in position order
        scores = index_scores(q[i], w[i], keys[i, cols].unsqueeze(0).expand(t, -1, -1), d)[:n]
        allowed = dsa.select(scores, q_pos[i, :n], topk, thr, sparse=True)
        want = dsa.attend(attn_q[i, :n, None], attn_k[i, cols, None], attn_v[i, cols, None], allowed, 1.0)[:, 0]
        out = _attend(attn_q[i, :n], attn_k[i], attn_v[i], got[i, 0, :n])
        assert torch.allclose(out, want, rtol=0, atol=1e-5)
        for r in range(n):
            if int(q_pos[i, r]) + 1 <= thr:
                assert torch.equal(got[i, 0, r], bias[i, 0, r])
            else:
                sparse_rows += 1
                assert int((got[i, 0, r] == 0).sum()) == topk
    assert sparse_rows == 6  # positions 8..13 of the first prompt
    # padded query rows and padded context columns stay masked
    assert torch.isneginf(got[1, 0, 3:]).all() and torch.isneginf(got[1, 0, :, 4:8]).all()


def _causal_prompt(g, t, length, h, d):
    """One prompt of ``t`` queries at the end of ``length`` keys (context then this chunk), causal."""
    q_pos = torch.arange(length - t, length)[None]
    bias = torch.where(torch.arange(length)[None, :] <= q_pos[0, :, None], 0.0, NEG_INF)[None, None]
    return (
        bias.to(torch.bfloat16),
        torch.randn(1, t, h, d, generator=g),
        torch.randn(1, t, h, generator=g),
        torch.randn(1, length, d, generator=g),
        torch.arange(length)[None],
        q_pos,
    )


def test_prefill_scoring_in_query_chunks_gives_the_unchunked_bias():
    """The budget splits the queries into chunks of score_rows rows; every budget, down to one row
    a chunk, gives the bias of one pass over all rows, bit for bit (a row's selection reads only
    its own scores)."""
    g = torch.Generator().manual_seed(5)
    t, length, h, d, topk, thr = 9, 40, 3, 8, 5, 12
    bias, q, w, keys, key_pos, q_pos = _causal_prompt(g, t, length, h, d)
    one_pass = prefill_bias(bias, q, w, keys, key_pos, q_pos, topk, thr, d, budget=1 << 40)
    assert score_rows(h, length, 1 << 40) >= t  # negative control: this is one chunk
    for rows in (1, 2, 4, 8):
        budget = rows * row_bytes(h, length)
        assert score_rows(h, length, budget) == rows
        assert torch.equal(prefill_bias(bias, q, w, keys, key_pos, q_pos, topk, thr, d, budget=budget), one_pass)
    # the selection did act: every row is past the threshold and keeps topk keys
    assert ((one_pass[0, 0] == 0).sum(-1) == topk).all()


def test_prefill_scoring_at_the_seed_threshold_selects_as_dsa_within_its_budget():
    """The real rule (32,768 keys, top-k 2,048) on long rows: queries at 32,766..32,771 (the last
    four see more than the threshold) against 32,772 keys, scored in chunks of 2 rows, keep exactly the keys
    dsa.select keeps; the rows at or below the threshold keep every visible key. GLM-5.3's shapes
    at 131,072 keys give a chunk within SCORE_BUDGET (score_rows), where one pass over a 4,096-token
    chunk would hold ~128 GiB (hpu_emulation.cost)."""
    g = torch.Generator().manual_seed(6)
    thr, topk, h, d = dsa.DENSE_UNTIL_KEYS, 2048, 2, 8
    t, length = 6, dsa.DENSE_UNTIL_KEYS + 4
    bias, q, w, keys, key_pos, q_pos = _causal_prompt(g, t, length, h, d)
    budget = 2 * row_bytes(h, length)
    got = prefill_bias(bias, q, w, keys, key_pos, q_pos, topk, thr, d, budget=budget)[0, 0]
    scores = index_scores(q[0], w[0], keys[0].unsqueeze(0).expand(t, -1, -1), d)
    want = dsa.select(scores, q_pos[0], topk, thr, sparse=True)
    assert torch.equal(got == 0, want)
    assert [int(n) for n in (got == 0).sum(-1)] == [32767, 32768, topk, topk, topk, topk]
    rows = score_rows(32, 131072)  # GLM-5.3: 32 index heads
    assert rows >= 1 and rows * row_bytes(32, 131072) <= SCORE_BUDGET


def test_decode_bias_on_shuffled_blocks_selects_as_dsa_and_leaves_rows_below_unchanged():
    """Three decode rows in vllm-gaudi's flat layout: each row's blocks in a shuffled order among
    the others', the last block of each partly used, one padding block. Each row's attention over
    its own blocks with the new bias is dsa.py's over the keys dsa.select keeps; a row at or below
    the threshold keeps its blocks' bias bit for bit; no block is all -inf where it had a used slot."""
    g = torch.Generator().manual_seed(3)
    topk, thr, bs, d, h = 4, 6, 4, 8, 2
    lens = [11, 5, 9]  # keys each row sees (its position + 1)
    blocks = []  # (row, logical block index, used slots)
    for r, n in enumerate(lens):
        for j in range((n + bs - 1) // bs):
            blocks.append((r, j, min(bs, n - j * bs)))
    order = torch.randperm(len(blocks), generator=g).tolist()
    blocks = [blocks[i] for i in order] + [(None, 0, 1)]  # a padding block (no row) at the end
    nb, rows = len(blocks), len(lens)
    mapping = torch.zeros(nb, rows)
    bias = torch.full((nb, bs), NEG_INF)
    key_pos = torch.zeros(nb, bs, dtype=torch.long)
    for i, (r, j, used) in enumerate(blocks):
        bias[i, :used] = 0
        key_pos[i] = torch.arange(j * bs, j * bs + bs)
        if r is not None:
            mapping[i, r] = 1
    q, w, keys = (
        torch.randn(rows, h, d, generator=g),
        torch.randn(rows, h, generator=g),
        torch.randn(nb, bs, d, generator=g),
    )
    q_pos = torch.tensor(lens) - 1
    got = decode_bias(bias, mapping, q, w, keys, key_pos, q_pos, topk, thr, d)
    assert torch.equal(got[-1], bias[-1])  # the padding block as it was
    attn_k, attn_v = torch.randn(nb, bs, d, generator=g), torch.randn(nb, bs, d, generator=g)
    attn_q = torch.randn(rows, d, generator=g)
    for r, n in enumerate(lens):
        mine = sorted((j, i) for i, (row, j, _) in enumerate(blocks) if row == r)
        idx = [i for _, i in mine]

        def flat(t, idx=idx):  # the row's blocks in position order, one slot per row
            return t[idx].reshape(-1, *t.shape[2:])

        index_k, att_k, att_v = flat(keys), flat(attn_k), flat(attn_v)
        scores = index_scores(q[r : r + 1], w[r : r + 1], index_k[:n].unsqueeze(0), d)
        allowed = dsa.select(scores, q_pos[r : r + 1], topk, thr, sparse=True)
        want = dsa.attend(attn_q[r : r + 1, None], att_k[:n, None], att_v[:n, None], allowed, 1.0)[:, 0]
        out = _attend(attn_q[r : r + 1], att_k, att_v, flat(got)[None])
        assert torch.allclose(out, want, rtol=0, atol=1e-5), r
        if n <= thr:
            assert torch.equal(got[idx], bias[idx])
        else:
            assert int((got[idx] == 0).sum()) == topk
            assert (got[idx] == UNSELECTED).any()
    used = ~torch.isneginf(bias)
    assert not torch.isneginf(got)[used].any()  # unselected slots are finite: no all -inf block
