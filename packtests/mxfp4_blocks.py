"""Adversarial bf16 blocks for the quantizer, one block of 32 per row (built with torch)."""

from __future__ import annotations

import numpy as np
import torch

TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]  # every E2M1 midpoint


def _bits_to_bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)


def blocks(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    out["zeros"] = torch.zeros(2, 32)
    out["negative zero"] = torch.full((2, 32), -0.0)
    out["all equal"] = torch.tensor([[0.3] * 32, [-1.7] * 32, [6.0] * 32, [7.0] * 32, [2.0**-120] * 32])
    rows = []
    for k in (-126, -20, -3, 0, 5, 100, 125):
        s = 2.0**k
        row = [6 * s] + [t * s for t in TIES] + [-t * s for t in TIES] + [0.0] * 17
        rows.append(row)
        # the same ties with amax just under the EVEN rounding point (1.75 * 4 = 7) and at it
        rows.append([6.96875 * s] + [t * s for t in TIES] * 4 + [0.0] * 3)
        rows.append([7.0 * s] + [t * s for t in TIES] * 4 + [0.0] * 3)
    out["E2M1 midpoints (ties)"] = torch.tensor(rows)
    rows = []
    for k in (-10, 0, 7):
        s = 2.0**k
        rows.append([6 * s] * 4 + [5.0 * s, 3.0 * s] + [0.5 * s] * 26)  # exactly 6 x scale
        rows.append([6.03125 * s, -6.03125 * s] + [1.0 * s] * 30)  # just above: saturates to 6
        rows.append([7.9375 * s] + [6.5 * s] * 31)  # the largest value of the same scale
    out["6 x scale and just above"] = torch.tensor(rows)
    sub = np.concatenate([np.arange(1, 33), np.arange(0x40, 0x60), 0x8000 | np.arange(0x70, 0x90)]).reshape(3, 32)
    mixed = sub.copy()
    mixed[:, 0] = 0x0080  # the smallest normal next to subnormals
    out["bf16 subnormals"] = torch.cat([_bits_to_bf16(sub), _bits_to_bf16(mixed)])
    near_max = np.full((3, 32), 0x3F80, dtype=np.uint16)
    near_max[0, 0] = 0x7F7F  # the bf16 maximum
    near_max[1, 5] = 0xFF7F  # its negative
    near_max[2, :] = 0x7F70 + np.arange(32) % 16  # a block of values near the maximum
    out["amax near the bf16 maximum"] = _bits_to_bf16(near_max)
    base = torch.randn(64, 32, generator=g) * 0.02
    base[torch.arange(64), torch.randint(0, 32, (64,), generator=g)] *= 50.0
    out["one outlier per block"] = base
    out["N(0, 0.02)"] = torch.randn(512, 32, generator=g) * 0.02
    finite = np.array([b for b in range(65536) if (b & 0x7F80) != 0x7F80], dtype=np.uint16)
    perm = np.random.default_rng(seed).permutation(finite)
    n = len(finite) // 32 * 32
    out["every finite bf16 pattern (sorted)"] = _bits_to_bf16(finite[:n].reshape(-1, 32))
    out["every finite bf16 pattern (shuffled)"] = _bits_to_bf16(perm[:n].reshape(-1, 32))
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


def all_blocks(seed: int = 0) -> torch.Tensor:
    return torch.cat(list(blocks(seed).values()))
