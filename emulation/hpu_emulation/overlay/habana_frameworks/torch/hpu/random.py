"""``torch.hpu.random``: the card's generator is the host's (one stream of random numbers)."""

import torch


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def initial_seed() -> int:
    return torch.initial_seed()
