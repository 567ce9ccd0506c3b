"""Greedy tokens against a reference model, aware of near-ties.

Past a step where the reference's top two logits are within ``tie`` of each other, two greedy
paths may part on rounding alone; tokens are compared up to that step, and a check that would
compare too few tokens fails instead of passing vacuously.
"""

from __future__ import annotations


class Reference:
    def __init__(self, tokens: list[list[int]], gaps: list[list[float]]):
        self.tokens, self.gaps = tokens, gaps

    def compared(self, tie: float) -> list[int]:
        return [next((i for i, g in enumerate(gaps) if g < tie), len(gaps)) for gaps in self.gaps]

    def check(self, got: list[list[int]], tie: float, min_fraction: float = 0.75) -> int:
        """Equal up to each reference near-tie; returns how many tokens were compared."""
        lengths = self.compared(tie)
        for tokens, gaps, out, n in zip(self.tokens, self.gaps, got, lengths, strict=True):
            assert out[:n] == tokens[:n], (out, tokens, [round(g, 5) for g in gaps])
        total = sum(len(t) for t in self.tokens)
        assert sum(lengths) >= min_fraction * total, (
            f"only {sum(lengths)} of {total} tokens before a near-tie (< {tie}): pick other prompts"
        )
        return sum(lengths)

    def check_divergence(self, got: list[list[int]], tie: float, min_fraction: float = 0.75) -> None:
        """Each output may part from the reference only at a step where the reference had a
        near-tie (top two logits within ``tie``); the equal prefixes must cover ``min_fraction``."""
        equal = 0
        for tokens, gaps, out in zip(self.tokens, self.gaps, got, strict=True):
            split = next((i for i, (a, b) in enumerate(zip(out, tokens, strict=True)) if a != b), None)
            if split is not None:
                assert gaps[split] < tie, (
                    f"parted from the reference at step {split} where its top-2 gap is {gaps[split]:.4f} "
                    f"(not a near-tie < {tie}): {out} vs {tokens}"
                )
            equal += len(tokens) if split is None else split
        total = sum(len(t) for t in self.tokens)
        assert equal >= min_fraction * total, f"only {equal} of {total} tokens equal before parting"


def greedy_reference(model, prompts: list[list[int]], new_tokens: int, forward=None) -> Reference:
    """``model``'s greedy tokens for each prompt alone, and at each step the gap between its top two
    logits. ``forward(ids) -> logits [1, T, V]`` defaults to ``model(input_ids=ids).logits``."""
    import torch

    forward = forward or (lambda ids: model(input_ids=ids).logits)
    tokens, gaps = [], []
    with torch.no_grad():
        for p in prompts:
            seq, gap = list(p), []
            for _ in range(new_tokens):
                top = forward(torch.tensor([seq]))[0, -1].float().topk(2)
                gap.append((top.values[0] - top.values[1]).item())
                seq.append(int(top.indices[0]))
            tokens.append(seq[len(p) :])
            gaps.append(gap)
    return Reference(tokens, gaps)
