"""The MXFP4 MoE TPC kernels' operation order in PyTorch (GLM_MXK, GLM_MXK_PREFILL), on CPU.

The kernels are in ``kernels/mxfp4-moe/`` (``mxfp4_gemv_bf16.c``, ``mxfp4_unpack_bf16.c``);
their header comments are the contract these functions follow step for step, and the device
gate (``kernels/mxfp4-moe/gate.py``) compares the built op with them on a card.

Weights are the converter's layout, as ``glm5_hpu.moe_mxfp4`` holds them: ``packed`` U8
[N, K/2] (element 2i in the low nibble) and ``scales`` U8 [N, K/32] (E8M0), N output rows, K
the input axis.

Decode of one element (integer only, no table and no multiply, as the kernel does it on 64-lane
int32 vectors). With nibble ``q`` (sign ``q >> 3``, exponent ``e = (q >> 1) & 3``, mantissa bit
``m = q & 1``) and scale code ``c``, E2M1 is (1 + m/2) * 2**(e-1) for e > 0 and m/2 for e = 0,
so the weight is (1 + f/2) * 2**(E - 127) with

    e > 0:          E = c + e - 1, f = m
    e = 0, m = 1:   E = c - 1,     f = 0
    e = 0, m = 0:   zero

and its float32 bits are ``E << 23 | f << 22`` where 1 <= E <= 254; ``(2 + f) << (E + 21)``
(a subnormal) where E <= 0 (the smallest E is -1, at c = 0); +inf where E >= 255 (the same
overflow the reference's float32 product gives); NaN for c = 255. The sign bit goes on last
(``-0`` for q = 8). Every weight is exact in bf16 too (at most two significant bits, no bit
below bit 20), which is what lets the unpack kernel keep the high half.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glm5_mxfp4.mxfp4 import BLOCK

# fp32 lanes of one TPC vector: the GEMV kernel's chunk of the input axis.
LANES = 64
_NAN = 0x7FC00000
_INF = 0x7F800000


def _check(packed: torch.Tensor, scales: torch.Tensor) -> int:
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"packed {packed.dtype} and scales {scales.dtype} must both be uint8")
    k = packed.shape[-1] * 2
    if packed.dim() < 1 or scales.shape[:-1] != packed.shape[:-1] or scales.shape[-1] * BLOCK != k:
        raise ValueError(
            f"packed {tuple(packed.shape)} and scales {tuple(scales.shape)} do not match (blocks of {BLOCK})"
        )
    return k


def decode_bits(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int32 [..., K]: the float32 bit patterns of the weights, by the kernels' integer recipe."""
    k = _check(packed, scales)
    p = packed.to(torch.int32)
    q = torch.stack([p & 0x0F, p >> 4], dim=-1).reshape(*packed.shape[:-1], k)  # low nibble first
    c = scales.to(torch.int32).repeat_interleave(BLOCK, dim=-1)
    e, m = (q >> 1) & 3, q & 1
    big = e > 0
    exp = torch.where(big, c + e - 1, c - 1)
    f = torch.where(big, m, torch.zeros_like(m))
    normal = (exp << 23) | (f << 22)
    sub = (2 + f) << (exp + 21).clamp(0, 21)  # used only where E <= 0; the clamp keeps every shift defined
    mag = torch.where(exp >= 255, torch.full_like(exp, _INF), torch.where(exp >= 1, normal, sub))
    mag = torch.where((e == 0) & (m == 0), torch.zeros_like(mag), mag)
    mag = torch.where(c == 255, torch.full_like(mag, _NAN), mag)
    return mag | ((q >> 3) << 31)


def decode(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [..., K]: the weights as the GEMV kernel forms them before multiplying."""
    return decode_bits(packed, scales).view(torch.float32)


def unpack_bf16(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [..., K]: the prefill unpack kernel (GLM_MXK_PREFILL). Each packed byte becomes one
    32-bit word, the high half of its high element's float32 pattern over the high half of its
    low element's (little-endian: element 2i first), so the kernel needs no lane shuffle; exact,
    since no weight has a bit below bit 20 (a NaN stays a NaN)."""
    bits = decode_bits(packed, scales)
    lo, hi = bits[..., 0::2], bits[..., 1::2]
    word = (hi & -65536) | ((lo >> 16) & 0xFFFF)
    return word.view(torch.bfloat16)


def gemv_accumulate(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [T, N]: the GEMV kernel's sums before the bf16 store, in its order.

    x bf16 [T, K]. The input axis is read in chunks of 128 elements (64 packed bytes, one byte
    per lane): lane l of chunk c holds elements 128c + 2l (low nibble) and 128c + 2l + 1 (high
    nibble). For each token t and row n a 64-lane float32 accumulator starts at +0, and for
    c = 0, 1, ... in turn lane l adds x * w of its low element, then of its high element (each
    product one float32 multiply, exact for finite normal results: a bf16 times a weight of two
    significant bits; each add one rounding). Lanes past K add nothing. Then the lanes are
    folded by halves, lane l += lane l + h for h = 32, 16, 8, 4, 2, 1; lane 0 is the sum."""
    k = _check(packed, scales)
    if packed.dim() != 2 or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(
            f"x {tuple(x.shape)} and weights {tuple(packed.shape)} (K = {k}) do not match: x [T, K], packed [N, K/2]"
        )
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x is {x.dtype}; the kernel reads bf16 activations")
    chunk = 2 * LANES
    kp = -(-k // chunk) * chunk
    w = F.pad(decode(packed, scales), (0, kp - k))
    xf = F.pad(x.float(), (0, kp - k))
    lane = torch.arange(LANES, device=x.device)
    acc = torch.zeros(x.shape[0], packed.shape[0], LANES, dtype=torch.float32, device=x.device)
    for c in range(kp // chunk):
        for half in (0, 1):
            idx = c * chunk + 2 * lane + half
            acc = torch.where(idx < k, acc + xf[:, None, idx] * w[None, :, idx], acc)
    h = LANES // 2
    while h:
        acc = acc[..., :h] + acc[..., h : 2 * h]
        h //= 2
    return acc[..., 0]


def gemv_bf16(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [T, N] = x @ W^T: the decode GEMV kernel (GLM_MXK); the fp32 sum rounded to nearest
    even, as the kernel's store converts it."""
    return gemv_accumulate(x, packed, scales).to(torch.bfloat16)
