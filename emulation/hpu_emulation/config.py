"""The emulated card: which Gaudi, how much memory, which execution mode.

Read from the environment so that vLLM's worker processes (spawned or forked) see the same
card as the process that started them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

DEVICE_ENV = "HPU_EMULATION_DEVICE"  # gaudi2 | gaudi3
MEMORY_ENV = "HPU_EMULATION_MEMORY"  # bytes of card memory, overrides the device's own
LAZY_ENV = "PT_HPU_LAZY_MODE"  # the bridge's own switch: 1 lazy (graphs), 0 eager

GIB = 1 << 30
# Card memory as Intel publishes it: Gaudi 2 has 96 GB HBM2E, Gaudi 3 128 GB HBM2E.
CARD_BYTES = {"gaudi2": 96 * 10**9, "gaudi3": 128 * 10**9}


@dataclass(frozen=True)
class Card:
    name: str  # gaudi2 | gaudi3
    memory: int  # bytes

    @property
    def fp8_e4m3(self) -> torch.dtype:
        # The e4m3 dtype a cast that names none gives: an assumption (every vllm-gaudi call site names
        # float8_e4m3fn). How each card reads float8_e4m3fn (Gaudi 2: bias 7, IEEE special values, 240
        # the largest) is kernels/fp8.py's card_read.
        return torch.float8_e4m3fnuz if self.name == "gaudi2" else torch.float8_e4m3fn


def card() -> Card:
    name = os.environ.get(DEVICE_ENV, "gaudi2").strip().lower()
    if name not in CARD_BYTES:
        raise ValueError(f"{DEVICE_ENV}={name!r}: expected one of {sorted(CARD_BYTES)}")
    mem = os.environ.get(MEMORY_ENV)
    try:
        memory = int(mem) if mem else CARD_BYTES[name]
    except ValueError:
        raise ValueError(f"{MEMORY_ENV}={mem!r}: expected a number of bytes") from None
    return Card(name, memory)


def is_lazy() -> bool:
    # The bridge defaults to lazy mode when PT_HPU_LAZY_MODE is unset.
    return os.environ.get(LAZY_ENV, "1") != "0"
