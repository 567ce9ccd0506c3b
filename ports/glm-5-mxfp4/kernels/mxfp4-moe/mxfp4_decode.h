/*
 * MXFP4 decode shared by the two kernels: 64 packed bytes (one per int32 lane) and their E8M0
 * scale codes in, the float32 bit patterns of the low and the high elements out. Integer only:
 * no table lookup, no multiply, so the weight is exact whatever the card does with float
 * subnormals. glm5_hpu/mxk.py (decode_bits) is the same recipe in PyTorch, and its tests hold it
 * bit-identical to the converter's dequantization (glm5_mxfp4.mxfp4.dequantize) for every byte
 * value under every scale code.
 *
 * Nibble q: sign q >> 3, exponent e = (q >> 1) & 3, mantissa bit m = q & 1; scale code c.
 * E2M1 is (1 + m/2) * 2^(e-1) for e > 0 and m/2 for e = 0, so the weight is
 * (1 + f/2) * 2^(E - 127) with
 *     e > 0:          E = c + e - 1, f = m
 *     e = 0, m = 1:   E = c - 1,     f = 0
 *     e = 0, m = 0:   zero
 * bits: E << 23 | f << 22 for 1 <= E <= 254; (2 + f) << (E + 21) for E <= 0 (a subnormal;
 * E >= -1); +inf for E >= 255; NaN (0x7FC00000) for c = 255; then the sign bit.
 */
#ifndef GLM_MXFP4_DECODE_H
#define GLM_MXFP4_DECODE_H

#define MXFP4_NAN_BITS 0x7FC00000
#define MXFP4_INF_BITS 0x7F800000

/* Lane-wise select on int32 vectors: cond ? a : b (the TPC compare-and-select). */
#ifndef SEL_I32
#define SEL_I32(cond_a, cond_b, op, a, b) v_i32_sel_##op##_i32_b((cond_a), (cond_b), (a), (b))
#endif

/* One nibble per lane (0..15) and its scale code per lane (0..255) -> float32 bits per lane. */
static inline int64 mxfp4_nibble_bits(int64 q, int64 c)
{
    const int64 zero = 0;
    int64 e = (q >> 1) & 3;
    int64 m = q & 1;
    int64 ex = SEL_I32(e, zero, grt, c + e - 1, c - 1);          /* E */
    int64 f = SEL_I32(e, zero, grt, m, zero);                    /* f */
    int64 normal = (ex << 23) | (f << 22);
    int64 shift = SEL_I32(ex, 0, grt, (int64)21, ex + 21);       /* E + 21 (20 or 21) where used */
    int64 sub = (f + 2) << shift;
    int64 mag = SEL_I32(ex, 0, grt, normal, sub);                /* E >= 1: normal */
    mag = SEL_I32(ex, 254, grt, (int64)MXFP4_INF_BITS, mag);     /* E >= 255: +inf */
    mag = SEL_I32(q & 7, zero, eq, zero, mag);                   /* +-0 */
    mag = SEL_I32(c, 255, eq, (int64)MXFP4_NAN_BITS, mag);       /* code 255: NaN */
    return mag | ((q >> 3) << 31);
}

#endif
