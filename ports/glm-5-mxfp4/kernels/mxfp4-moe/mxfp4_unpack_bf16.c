/*
 * MXFP4 -> bf16 unpack of one expert projection for GLM-5.3's prefill-sized MoE calls
 * (GLM_MXK_PREFILL=1: 256 to 4,096 tokens), whose matmul then runs on the MME in bf16; TPC-C
 * for Gaudi 2 (tpc-clang -march=gaudi2).
 *
 * Tensors (TPC dimension order, dim0 fastest; the op hpu_glm_mxfp4.cpp prepares them):
 *   packed  u8   [K/2, N]    E2M1 nibbles, element 2j in the low nibble of byte j
 *   scales  u8   [K/32, N]   E8M0 codes
 *   out     i32  [K/2, N]    one word per packed byte; the op views it as bf16 [N, K]
 * Index space: dim0 = ceil(K / 512) (256 bytes per member), dim1 = N.
 *
 * Operation order (the contract; glm5_hpu/mxk.py unpack_bf16 writes it in PyTorch):
 *   for each byte j: lo, hi = decode(low nibble), decode(high nibble)   (mxfp4_decode.h)
 *   out[j] = (hi & 0xFFFF0000) | (lo >> 16)
 * Little-endian, so the word is bf16 element 2j then 2j + 1: no lane shuffle. Keeping the high
 * half is exact: every weight has at most two significant bits and none below bit 20. Integer
 * operations only, so the result is bit-identical to the reference dequantization
 * (glm5_hpu/moe_mxfp4.py dequantize to bf16), which the tests show on CPU for every byte value
 * under every scale code and the gate checks on a card.
 *
 * Not built or run in the repository's CI (no TPC toolchain, no card): see README.md.
 */

#include "mxfp4_decode.h"

#define LANES 64

#ifndef U8_QUARTER_TO_I32
#define U8_QUARTER_TO_I32(v, q) v_convert_u8_to_i32_b((v), ((q) << 8) | SW_RHNE)
#endif
#ifndef LANE_ID
#define LANE_ID() read_lane_id_4b_b()
#endif
#ifndef SHUFFLE_I32
#define SHUFFLE_I32(v, src) v_i32_shuffle_b((v), (src))
#endif

void main(tensor packed, tensor scales, tensor out)
{
    const int5 start = get_index_space_offset();
    const int5 end = get_index_space_size() + start;
    const int64 lane = LANE_ID();

    for (int n = start[1]; n < end[1]; n++)
    {
        for (int m = start[0]; m < end[0]; m++)
        {
            int5 wc = {m * 4 * LANES, n, 0, 0, 0};
            uchar256 wb = v_u8_ld_tnsr_b(wc, packed);
            int5 sc = {m * 16, n, 0, 0, 0};        /* the 16 scale codes of these 256 bytes */
            uchar256 sb = v_u8_ld_tnsr_b(sc, scales);
            #pragma unroll
            for (int q = 0; q < 4; q++)
            {
                int64 byte = U8_QUARTER_TO_I32(wb, q);
                int64 code = SHUFFLE_I32(U8_QUARTER_TO_I32(sb, 0), (lane >> 4) + 4 * q);
                int64 lo = mxfp4_nibble_bits(byte & 15, code);
                int64 hi = mxfp4_nibble_bits(byte >> 4, code);
                int64 word = (hi & (int64)0xFFFF0000) | ((lo >> 16) & 0xFFFF);
                int5 oc = {m * 4 * LANES + q * LANES, n, 0, 0, 0};
                v_i32_st_tnsr(oc, out, word);     /* bytes past K/2 fall outside out: dropped */
            }
        }
    }
}
