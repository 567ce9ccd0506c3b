"""MXFP4 (OCP MX v1.0): E2M1 elements, one E8M0 scale per 32 along the last axis.

Storage, as every reader we test against expects it:
  * elements: uint8, two per byte, element 2i in the low nibble, 2i+1 in the high nibble;
    E2M1 codes 0..7 = +0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign;
  * scales: uint8 E8M0 exponent, value 2**(code - 127).

Scale modes (the exponent X of the block scale 2**X, amax = the block's largest |v|):
  * "floor": X = floor(log2 amax) - 2 (the OCP rule); values in (6, 8) * 2**X saturate to 6;
  * "even":  amax is first rounded at one mantissa bit (amax >= 1.75 * 2**e counts as 2**(e+1)),
             then the same; this is what vLLM's own quantizer, compressed-tensors and Quark produce
             (except vLLM 0.30.0's Triton kernel at scale codes 0 and 253: the README's format section).
X is clamped to [-127, 128]; blocks whose scale code is 0 divide by 2**-126, as torchao does.
Elements round to nearest, ties to even, and saturate to +-6.

The scale comes from the exponent bits of amax, never from a cast to an e8m0 dtype: those casts
round (1.5 -> 2, 3 -> 4) and map 0 to NaN or code 0 depending on the library.

Two implementations: `quantize` (a numba kernel on the bf16 bit patterns, integer arithmetic
only; `quantize_rows` runs the same row code on the calling thread) and `quantize_reference` (numpy float arithmetic, written from the rules above
without sharing code with the kernel). Tests hold both bit-exact to torchao.
"""

from __future__ import annotations

import numba
import numpy as np

BLOCK = 32
SCALE_MODES = ("floor", "even")
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)

# Rounding boundaries between consecutive E2M1 magnitudes, and whether a value exactly on the
# boundary goes up (ties to even: the upper neighbour has the even code).
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (False, True, False, True, False, True, False)


class NonFiniteError(ValueError):
    """A block holds Inf or NaN; `index` is the first such element (row-major, of the 2-D view)."""

    def __init__(self, index: tuple[int, ...], value: float):
        super().__init__(f"non-finite value {value} at index {index}")
        self.index = index
        self.value = value


def _threshold_table() -> np.ndarray:
    """bf16 bit patterns of (boundary * effective scale) for every scale code, [256, 7] int32.

    Every product is exactly representable (boundaries have at most 3 significant bits and the
    effective scale exponent is in [-126, 127]); one that overflows becomes the Inf pattern,
    which no finite element reaches. Positive bf16 values order like their bit patterns, so
    `abs_bits > T` is the same test as `|v| / scale > boundary`.
    """
    table = np.zeros((256, 7), dtype=np.int32)
    with np.errstate(over="ignore"):
        for code in range(256):
            exp = max(code - 127, -126)
            vals = np.array(_BOUNDS, dtype=np.float32) * np.float32(2.0) ** np.float32(exp)
            bits = vals.view(np.uint32)
            assert np.all((bits & 0xFFFF) == 0) or code >= 254
            table[code] = (bits >> 16).astype(np.int32)
    return table


_THRESHOLDS = _threshold_table()


FORMULA_MIN_CODE = 8


@numba.njit(inline="always", cache=True)
def _magnitude_code(a, code):
    """E2M1 magnitude code (0..7) of an element with abs bits `a` in a block of scale code `code`.

    With d the element's exponent minus the scale's, and m its 7 mantissa bits, |v| / scale lies
    in [2**d, 2**(d+1)), so d and m alone decide the rounding: for d >= 0 the boundaries sit at
    m = 32 (ties down to the even code) and m = 96 (ties up), and d = 2 saturates at 7; d = -1 has
    its boundary at m = 64 (0.75: ties up to 1.0); d = -2 rounds to 0.5 unless v is exactly 0.25.
    This holds while the element and the scale are normal; blocks with scale codes below
    FORMULA_MIN_CODE (amax under 2**-117) use the threshold compares instead. Integer arithmetic
    only, which the compiler vectorizes; a test holds it equal to the threshold rule everywhere.
    """
    d = ((a >> 7) & 0xFF) - code
    m = a & 127
    up = min(2 * d + 2 + np.int32(m > 32) + np.int32(m >= 96), 7)
    # one expression of selects rather than branches: it vectorizes
    return up if d >= 0 else ((1 + np.int32(m >= 64)) if d == -1 else (np.int32(m > 0) if d == -2 else 0))


@numba.njit(cache=True)
def magnitude_codes(abs_bits, code):
    """`_magnitude_code` over an array (for tests)."""
    out = np.empty(abs_bits.shape[0], dtype=np.int32)
    for i in range(abs_bits.shape[0]):
        out[i] = _magnitude_code(np.int32(abs_bits[i]), np.int32(code))
    return out


@numba.njit(cache=True)
def _small_block(xr, qr, first, b, t):
    """A block whose scale code is below FORMULA_MIN_CODE: compare against the exact thresholds."""
    for j in range(16):
        v0 = np.int32(xr[first + 2 * j])
        v1 = np.int32(xr[first + 2 * j + 1])
        a0 = v0 & 0x7FFF
        a1 = v1 & 0x7FFF
        c0 = (
            np.int32(a0 > t[0])
            + np.int32(a0 >= t[1])
            + np.int32(a0 > t[2])
            + np.int32(a0 >= t[3])
            + np.int32(a0 > t[4])
            + np.int32(a0 >= t[5])
            + np.int32(a0 > t[6])
        ) | ((v0 >> 12) & 8)
        c1 = (
            np.int32(a1 > t[0])
            + np.int32(a1 >= t[1])
            + np.int32(a1 > t[2])
            + np.int32(a1 >= t[3])
            + np.int32(a1 > t[4])
            + np.int32(a1 >= t[5])
            + np.int32(a1 > t[6])
        ) | ((v1 >> 12) & 8)
        qr[b * 16 + j] = np.uint8(c0 | (c1 << 4))


@numba.njit(inline="always", cache=True)
def _row(xr, even, table, qr, sr):
    """One row: its scales into `sr`, its packed codes into `qr`; True if it holds Inf or NaN."""
    bad = False
    nblocks = xr.shape[0] // 32
    for b in range(nblocks):
        first = b * 32
        m = 0
        for i in range(32):
            m = max(m, np.int32(xr[first + i]) & 0x7FFF)  # type: ignore[assignment]  # numba types m
        if m > 0x7F7F:  # exponent all ones: Inf or NaN
            bad = True
            sr[b] = 255
            for j in range(16):
                qr[b * 16 + j] = 0
            continue
        if even:
            m = (m + 0x20) & 0x7F80
        code = min(max(((m >> 7) & 0xFF) - 129, -127), 128) + 127
        sr[b] = code
        if code < FORMULA_MIN_CODE:
            _small_block(xr, qr, first, b, table[code])
            continue
        for j in range(16):
            v0 = np.int32(xr[first + 2 * j])
            v1 = np.int32(xr[first + 2 * j + 1])
            c0 = _magnitude_code(v0 & 0x7FFF, code) | ((v0 >> 12) & 8)
            c1 = _magnitude_code(v1 & 0x7FFF, code) | ((v1 >> 12) & 8)
            qr[b * 16 + j] = np.uint8(c0 | (c1 << 4))
    return bad


@numba.njit(parallel=True, nogil=True, cache=True)
def _kernel(x16, even, table, out_q, out_s, bad):
    """Every row, split over numba's threads (`quantize`)."""
    for r in numba.prange(x16.shape[0]):
        if _row(x16[r], even, table, out_q[r], out_s[r]):
            bad[r] = 1


@numba.njit(nogil=True, cache=True)
def _kernel_serial(x16, even, table, out_q, out_s, first, stop):
    """Rows first..stop-1 on the calling thread, without the GIL (the converter runs one such call
    per worker thread, each on its own tensor). Returns the number of rows holding Inf or NaN."""
    bad = 0
    for r in range(first, stop):
        if _row(x16[r], even, table, out_q[r], out_s[r]):
            bad += 1
    return bad


def as_bf16_bits(x) -> np.ndarray:
    """A uint16 view of bf16 data: a numpy uint16 array, raw bytes, or a torch bf16 tensor."""
    if isinstance(x, np.ndarray):
        if x.dtype != np.uint16:
            raise TypeError(f"expected the uint16 bit patterns of bf16 data, got {x.dtype}")
        return x
    if isinstance(x, (bytes, bytearray, memoryview)):
        return np.frombuffer(x, dtype=np.uint16)
    try:
        import torch
    except ImportError:  # pragma: no cover
        raise TypeError(f"cannot read bf16 bits from {type(x).__name__}") from None
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.bfloat16:
            raise TypeError(f"expected a bfloat16 tensor, got {x.dtype}")
        return x.contiguous().view(torch.int16).numpy().view(np.uint16)
    raise TypeError(f"cannot read bf16 bits from {type(x).__name__}")


def _check(x16: np.ndarray, mode: str) -> np.ndarray:
    if mode not in SCALE_MODES:
        raise ValueError(f"scale mode must be one of {SCALE_MODES}, got {mode!r}")
    if x16.ndim == 0 or x16.shape[-1] % BLOCK:
        raise ValueError(
            f"the block axis (last) has {x16.shape[-1] if x16.ndim else 0} elements, not a multiple of {BLOCK}"
        )
    return np.ascontiguousarray(x16).reshape(-1, x16.shape[-1])


def _first_non_finite(x2: np.ndarray, shape: tuple[int, ...]) -> NonFiniteError:
    flat = np.flatnonzero((x2.reshape(-1) & 0x7F80) == 0x7F80)[0]
    index = tuple(int(i) for i in np.unravel_index(flat, shape))
    bits = np.array([x2.reshape(-1)[flat]], dtype=np.uint16).astype(np.uint32) << 16
    return NonFiniteError(index, float(bits.view(np.float32)[0]))


def quantize(
    x, mode: str = "even", out_q: np.ndarray | None = None, out_s: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """bf16 [..., K] -> (packed uint8 [..., K/2], scales uint8 [..., K/32]). Raises NonFiniteError."""
    x16 = as_bf16_bits(x)
    shape = x16.shape
    x2 = _check(x16, mode)
    rows, k = x2.shape
    q = np.empty((rows, k // 2), dtype=np.uint8) if out_q is None else out_q.reshape(rows, k // 2)
    s = np.empty((rows, k // BLOCK), dtype=np.uint8) if out_s is None else out_s.reshape(rows, k // BLOCK)
    bad = np.zeros(rows, dtype=np.uint8)
    _kernel(x2, mode == "even", _THRESHOLDS, q, s, bad)
    if bad.any():
        raise _first_non_finite(x2, shape)
    return q.reshape(*shape[:-1], k // 2), s.reshape(*shape[:-1], k // BLOCK)


def quantize_rows(x2: np.ndarray, mode: str, out_q: np.ndarray, out_s: np.ndarray, first: int, stop: int) -> None:
    """Rows first..stop-1 of the 2-D uint16 array `x2` into the 2-D `out_q`, `out_s`, on this thread
    (the GIL released): the same codes as `quantize`, which tests hold bit-exact. Raises
    NonFiniteError with the first non-finite index of the whole of `x2`."""
    if mode not in SCALE_MODES:
        raise ValueError(f"scale mode must be one of {SCALE_MODES}, got {mode!r}")
    if _kernel_serial(x2, mode == "even", _THRESHOLDS, out_q, out_s, first, stop):
        raise _first_non_finite(x2, x2.shape)


def _bf16_to_f32(x16: np.ndarray) -> np.ndarray:
    return (x16.astype(np.uint32) << 16).view(np.float32)


def quantize_reference(x, mode: str = "even") -> tuple[np.ndarray, np.ndarray]:
    """The same contract as `quantize`, in plain numpy float arithmetic (slow; for tests)."""
    x16 = as_bf16_bits(x)
    shape = x16.shape
    x2 = _check(x16, mode)
    if np.any((x2 & 0x7F80) == 0x7F80):
        raise _first_non_finite(x2, shape)
    rows, k = x2.shape
    v = _bf16_to_f32(x2).reshape(rows, k // BLOCK, BLOCK)
    amax = np.abs(v).max(axis=-1)
    amax_bits = amax.astype(np.float32).view(np.uint32).astype(np.int64)
    if mode == "even":
        amax_bits = (amax_bits + 0x200000) & 0x7F800000
    exp = np.clip((amax_bits >> 23) - 127 - 2, -127, 128)
    codes = (exp + 127).astype(np.uint8)
    scale = np.ldexp(np.float32(1.0), np.maximum(exp, -126)).astype(np.float32)
    mag = np.minimum(np.abs(v) / scale[..., None], np.float32(6.0))
    idx = np.zeros(mag.shape, dtype=np.uint8)
    for i, (bound, up) in enumerate(zip(_BOUNDS, _TIE_UP, strict=True)):
        above = (mag >= bound) if up else (mag > bound)
        idx = np.where(above, np.uint8(i + 1), idx)
    sign = (v.view(np.uint32) >> 31).astype(np.uint8) << 3
    nib = (idx | sign).reshape(rows, k)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed.reshape(*shape[:-1], k // 2), codes.reshape(*shape[:-1], k // BLOCK)


def dequantize(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(packed uint8 [..., K/2], scales uint8 [..., K/32]) -> float32 [..., K].

    Every value is exact in bf16 as well. Two edges, both far from real weights:
      * scale code 0 decodes as 2**-127 (torchao and transformers do the same; vLLM's torch reader
        gives 0 there), while `quantize`, like torchao, divides such a block by 2**-126: it comes
        back at half its value. Code 0 is written only for blocks whose amax is below 2**-124
        ("floor") or below 1.75 * 2**-125 ("even");
      * in "even" mode a block whose amax is at least 1.75 * 2**127 gets scale code 253 (2**126).
        Its elements of magnitude 1.75 * 2**127 and up are 3.5 or more scales: they round to 4
        (3.5 is a tie; 4 has the even code), and 4 * 2**126 = 2**128 decodes to +-inf in float32
        and bf16 (torchao and transformers too). None saturates (bf16's largest is under
        4 * 2**126); smaller elements stay finite. "floor" gives that block code 252, all finite.
    """
    packed = np.asarray(packed, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.uint8)
    k = packed.shape[-1] * 2
    if scales.shape[-1] * BLOCK != k or scales.shape[:-1] != packed.shape[:-1]:
        raise ValueError(f"packed {packed.shape} and scales {scales.shape} do not match")
    lo = packed & 0x0F
    hi = packed >> 4
    nib = np.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], k)
    vals = E2M1_VALUES[nib & 7] * np.where(nib & 8, np.float32(-1.0), np.float32(1.0))
    factor = np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)
    if np.any(scales == 255):
        factor = np.where(scales == 255, np.float32(np.nan), factor)
    with np.errstate(over="ignore"):  # "even" near the bf16 maximum: 4 * 2**126 is beyond float32
        vals = vals.reshape(*packed.shape[:-1], k // BLOCK, BLOCK) * factor[..., None]
    return vals.reshape(*packed.shape[:-1], k).astype(np.float32)


def relative_error(x, mode: str) -> float:
    """||dequant(quant(x)) - x|| / ||x|| (Frobenius), for choosing and documenting the default mode."""
    x16 = as_bf16_bits(x)
    ref = _bf16_to_f32(x16).astype(np.float64)
    deq = dequantize(*quantize(x16, mode)).astype(np.float64)
    return float(np.linalg.norm(deq - ref) / np.linalg.norm(ref))
