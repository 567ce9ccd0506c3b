"""GLM_SPEC_DEVICE_REJECT's greedy rejection (glm5_hpu/spec_device.py) against the rule it keeps,
written out request by request. vllm-gaudi's own function is compared with it on the emulated
card in tests/e2e/test_hpu_mxk_op.py, and the lever through the runner in
tests/e2e/test_vllm_gaudi_emulation.py."""

from __future__ import annotations

import itertools

import torch

from glm5_hpu.spec_device import greedy_rejection

PLACEHOLDER = -1


def rule(drafts, targets, bonus, num_drafts):
    """One request: the targets up to and including the first difference among the positions
    compared (every position of the padded row: a padded draft counts as a difference), kept only
    at real draft positions; the bonus at num_drafts when no real draft differed."""
    k = len(drafts)
    out = [PLACEHOLDER] * (k + 1)
    differs = [d != t for d, t in zip(drafts, targets, strict=True)]
    any_differs = any(differs) and num_drafts != 0
    accepted = differs.index(True) + 1 if any_differs else num_drafts
    for p in range(min(accepted, num_drafts)):
        out[p] = targets[p]
    if not any_differs:
        out[num_drafts] = bonus
    return out


def _run(rows, k):
    drafts = torch.tensor([r[0] for r in rows]).view(-1, 1)
    targets = torch.tensor([r[1] for r in rows]).view(-1)
    bonus = torch.tensor([[r[2]] for r in rows])
    cu = torch.tensor(list(itertools.accumulate(r[3] for r in rows)))
    got = greedy_rejection(drafts.view(-1, 1), targets, bonus, cu, PLACEHOLDER)
    assert got.dtype == torch.int32 and got.shape == (len(rows), k + 1)
    return got.tolist()


def test_every_small_case_keeps_the_rule():
    checked = 0
    for k in (1, 2, 3):
        for num_drafts in range(k + 1):
            for drafts in itertools.product((5, 7), repeat=k):
                for targets in itertools.product((5, 7), repeat=k):
                    padded = list(drafts[:num_drafts]) + [PLACEHOLDER] * (k - num_drafts)
                    row = (padded, list(targets), 9, num_drafts)
                    got = _run([row, ([7] * k, [7] * k, 3, k)], k)  # with a fully accepted neighbour
                    assert got[0] == rule(*row), (row, got[0])
                    assert got[1] == [7] * k + [3]
                    checked += 1
    assert checked == sum((k + 1) * 4**k for k in (1, 2, 3))


def test_random_batches_keep_the_rule():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, k = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        rows = []
        for _ in range(n):
            num = int(torch.randint(0, k + 1, (1,), generator=g))
            targets = torch.randint(0, 4, (k,), generator=g).tolist()
            drafts = [t if torch.rand(1, generator=g) < 0.7 else (t + 1) % 4 for t in targets[:num]]
            rows.append((drafts + [PLACEHOLDER] * (k - num), targets, int(torch.randint(0, 4, (1,), generator=g)), num))
        assert _run(rows, k) == [rule(*r) for r in rows]
