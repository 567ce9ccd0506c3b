/*
 * MXFP4 expert GEMV for GLM-5.3's decode-sized MoE calls (GLM_MXK=1): y = x @ W^T with W in
 * the converter's MXFP4 layout, decoded in registers; TPC-C for Gaudi 2 (tpc-clang
 * -march=gaudi2).
 *
 * Tensors (TPC dimension order, dim0 fastest; the PyTorch op hpu_glm_mxfp4.cpp prepares them):
 *   xs      fp32 [K/2, 2, T]   the activations, de-interleaved: xs[j, 0, t] = x[t, 2j],
 *                              xs[j, 1, t] = x[t, 2j + 1] (bf16 -> fp32 is exact)
 *   packed  u8   [K/2, N]      W's E2M1 nibbles as the checkpoint holds them (element 2j in the
 *                              low nibble of byte j)
 *   scales  u8   [K/32, N]     W's E8M0 codes, one per 32 elements
 *   y       bf16 [T, N]        tokens along dim0, i.e. PyTorch [N, T]; the op returns y.t()
 * T <= MXK_MAX_TOKENS (16): decode-sized calls only; the glue refuses more.
 * Index space: dim0 = N, one output row per member.
 *
 * Operation order (the contract; glm5_hpu/mxk.py gemv_accumulate and gemv_bf16 write it in
 * PyTorch, and kernels/mxfp4-moe/gate.py compares the two on a card):
 *
 *   for each token t: acc[t] = 64 lanes of +0.0f
 *   for chunk c = 0, 1, ..., ceil(K / 128) - 1:         -- 128 elements, 64 packed bytes
 *       lane l reads byte j = 64c + l and its scale code scales[j / 16]
 *       w_lo, w_hi = decode(low nibble), decode(high nibble)   (mxfp4_decode.h, exact)
 *       for each token t:
 *           acc[t][l] = acc[t][l] + x[t, 2j]     * w_lo     -- low element first
 *           acc[t][l] = acc[t][l] + x[t, 2j + 1] * w_hi
 *       lanes with 2j >= K add nothing (predicated, not zero-added: -0 stays -0)
 *   for each token t, fold the lanes by halves:
 *       for h = 32, 16, 8, 4, 2, 1: acc[t][l] = acc[t][l] + acc[t][l + h]  (l < h)
 *   y[t, n] = bf16(acc[t][0]), round to nearest even
 *
 *   Each product is one fp32 multiply and is exact for finite normal results (a bf16 times a
 *   weight of at most two significant bits: at most 10 significant bits), so fused or separate
 *   multiply-add gives the same sums; -ffp-contract=off keeps it explicit. Each add is one fp32
 *   rounding. The only places the card may differ from the CPU emulation are fp32 subnormal
 *   products or sums (if the TPC flushes them) and the bf16 conversion's rounding mode; the gate
 *   counts differing elements.
 *
 * Three operations are TPC-specific and kept in macros, because their intrinsic names are not
 * checked here (no SDK): the u8 -> i32 widening of a quarter of a 256-byte load, the lane
 * shuffle (lane l takes lane src[l]) used for the scale spread and the fold, and the lane id.
 * A wrong name is a compile error in build.sh step 1 (exit 4), never a silent change of order.
 *
 * Not built or run in the repository's CI (no TPC toolchain, no card): see README.md.
 */

#include "mxfp4_decode.h"

#define LANES 64
#define MXK_MAX_TOKENS 16

#ifndef U8_QUARTER_TO_I32
/* bytes 64*q .. 64*q+63 of a 256-lane u8 vector, zero-extended to 64 int32 lanes */
#define U8_QUARTER_TO_I32(v, q) v_convert_u8_to_i32_b((v), ((q) << 8) | SW_RHNE)
#endif
#ifndef LANE_ID
#define LANE_ID() read_lane_id_4b_b()
#endif
#ifndef SHUFFLE_I32
#define SHUFFLE_I32(v, src) v_i32_shuffle_b((v), (src))
#endif
#ifndef SHUFFLE_F32
#define SHUFFLE_F32(v, src) v_f32_shuffle_b((v), (src))
#endif
#ifndef F32_TO_BF16_RNE
#define F32_TO_BF16_RNE(v) v_convert_f32_to_bf16_all_b((v), SW_RHNE)
#endif
/* Lane-wise selects on int32 lanes a, b: (a == b ? x : y), (a < b ? x : y). */
#ifndef SEL_F32_EQ
#define SEL_F32_EQ(a, b, x, y) v_f32_sel_eq_i32_b((a), (b), (x), (y))
#endif
#ifndef SEL_F32_LT
#define SEL_F32_LT(a, b, x, y) v_f32_sel_less_i32_b((a), (b), (x), (y))
#endif

void main(tensor xs, tensor packed, tensor scales, tensor y, int k_elems, int tokens)
{
    const int5 start = get_index_space_offset();
    const int5 end = get_index_space_size() + start;
    const int64 lane = LANE_ID();
    const int chunks = (k_elems + 2 * LANES - 1) / (2 * LANES);

    for (int n = start[0]; n < end[0]; n++)
    {
        float64 acc[MXK_MAX_TOKENS];
        #pragma unroll
        for (int t = 0; t < MXK_MAX_TOKENS; t++)
            acc[t] = 0.0f;

        for (int c = 0; c < chunks; c++)
        {
            /* 256 bytes from byte 64c: quarter 0 is this chunk (the rest is re-read later) */
            int5 wc = {c * LANES, n, 0, 0, 0};
            uchar256 wb = v_u8_ld_tnsr_b(wc, packed);
            int64 byte = U8_QUARTER_TO_I32(wb, 0);
            int5 sc = {c * 4, n, 0, 0, 0};            /* the chunk's 4 scale codes */
            uchar256 sb = v_u8_ld_tnsr_b(sc, scales);
            int64 code = SHUFFLE_I32(U8_QUARTER_TO_I32(sb, 0), lane >> 4);

            int64 w_lo_bits = mxfp4_nibble_bits(byte & 15, code);
            int64 w_hi_bits = mxfp4_nibble_bits(byte >> 4, code);
            float64 w_lo = *(float64*)&w_lo_bits;
            float64 w_hi = *(float64*)&w_hi_bits;
            /* lanes past K: keep acc as it is (2j >= K <=> j >= K/2) */
            int64 j = lane + c * LANES;

            for (int t = 0; t < tokens; t++)
            {
                int5 xc = {c * LANES, 0, t, 0, 0};
                float64 x_lo = v_f32_ld_tnsr_b(xc, xs);
                xc[1] = 1;
                float64 x_hi = v_f32_ld_tnsr_b(xc, xs);
                float64 p_lo = x_lo * w_lo;
                float64 a = acc[t] + p_lo;
                acc[t] = SEL_F32_LT(j, k_elems / 2, a, acc[t]);
                float64 p_hi = x_hi * w_hi;
                a = acc[t] + p_hi;
                acc[t] = SEL_F32_LT(j, k_elems / 2, a, acc[t]);
            }
        }

        float64 out = 0.0f;
        for (int t = 0; t < tokens; t++)
        {
            float64 s = acc[t];
            #pragma unroll
            for (int h = LANES / 2; h >= 1; h /= 2)
                s = s + SHUFFLE_F32(s, lane + h);   /* lanes >= h are garbage from here on */
            /* lane t of the output row takes lane 0's sum */
            out = SEL_F32_EQ(lane, t, SHUFFLE_F32(s, 0 * lane), out);
        }
        int5 yc = {0, n, 0, 0, 0};
        /* tokens along dim0; lanes past T fall outside y and are dropped */
        v_bf16_st_tnsr_partial(yc, y, F32_TO_BF16_RNE(out));
    }
}
