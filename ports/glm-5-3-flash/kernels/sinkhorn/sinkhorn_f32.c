/*
 * mHC Sinkhorn for GLM-5.3-Flash: 20-iteration Sinkhorn normalisation of 4 x 4 fp32 matrices,
 * one matrix per vector lane, TPC-C for Gaudi 2 (tpc-clang -march=gaudi2).
 *
 * Layout. The PyTorch op (hpu_glm_sinkhorn.cpp) hands the kernel the R matrices transposed to
 * [16, R]: element k = 4*i + j of matrix r sits at (dim0 = r, dim1 = k). One 64-lane float64
 * load at (r0, k) therefore holds element (i, j) of matrices r0 .. r0+63, and every lane runs
 * the scalar recipe below on its own matrix. Lanes past R read the tensor's zero padding and
 * their stores are dropped; 0 * reciprocal(0 + eps) stays 0, so they never make NaN.
 *
 * Operation order (the contract; glm5_next_hpu/mhc.py sinkhorn_tpc_order mirrors it line for
 * line on CPU, and the sinkhorn device gate compares the two bit for bit):
 *
 *   c = input (already softmax(...) + hc_eps, fp32)
 *   col_step(c)                                   -- one column normalisation first
 *   repeat iters - 1 times (19 for iters = 20):
 *       row_step(c)
 *       col_step(c)                               -- so the last step is a column step
 *
 *   row_step, for each row i (sum over the last axis, j) -- PAIRWISE:
 *       s = (c[i][0] + c[i][1]) + (c[i][2] + c[i][3])
 *       r = reciprocal(s + eps)                   -- eps added to the finished sum
 *       c[i][j] = c[i][j] * r   for j = 0..3      -- multiply by the reciprocal, no divide
 *
 *   col_step, for each column j (sum over axis -2, i) -- SEQUENTIAL:
 *       s = ((c[0][j] + c[1][j]) + c[2][j]) + c[3][j]
 *       r = reciprocal(s + eps)
 *       c[i][j] = c[i][j] * r   for i = 0..3
 *
 *   Every operation is one fp32 rounding (no FMA contraction: the sums and products are
 *   separate instructions, compiled with -ffp-contract=off). The reduction orders are those
 *   the device uses for torch.sum over a 4-element axis in the stock loop (vLLM
 *   kernels/mhc/torch.py), and x / y on the device is x * reciprocal(y); reproducing both is
 *   what makes the kernel bit-identical to the stock loop on a card. The reciprocal is the
 *   TPC special function (RECIPROCAL below); if the gate ever shows a one-ulp difference, that
 *   choice is the first thing to check.
 *
 * Scalar parameters: eps (hc_eps, 1e-6 for GLM-5.3-Flash) and iters (hc_sinkhorn_iters, 20).
 * Index space: dim0 = ceil(R / 64) (see the glue, sinkhorn_glue.cpp).
 *
 * Not built or run in the repository's CI (no TPC toolchain, no card): see README.md.
 */

#ifndef RECIPROCAL
#define RECIPROCAL(x) v_reciprocal_f32(x)
#endif

#define N 4
#define VEC 64

void main(tensor comb_in, tensor comb_out, float eps, int iters)
{
    const int5 start = get_index_space_offset();
    const int5 end = get_index_space_size() + start;

    for (int v = start[0]; v < end[0]; v++)
    {
        int5 coord = {v * VEC, 0, 0, 0, 0};
        float64 c[N * N];

        #pragma unroll
        for (int k = 0; k < N * N; k++)
        {
            coord[1] = k;
            c[k] = v_f32_ld_tnsr_b(coord, comb_in);
        }

        // col_step
        #pragma unroll
        for (int j = 0; j < N; j++)
        {
            float64 s = ((c[0 * N + j] + c[1 * N + j]) + c[2 * N + j]) + c[3 * N + j];
            float64 r = RECIPROCAL(s + eps);
            #pragma unroll
            for (int i = 0; i < N; i++)
                c[i * N + j] = c[i * N + j] * r;
        }

        for (int it = 1; it < iters; it++)
        {
            // row_step
            #pragma unroll
            for (int i = 0; i < N; i++)
            {
                float64 s = (c[i * N + 0] + c[i * N + 1]) + (c[i * N + 2] + c[i * N + 3]);
                float64 r = RECIPROCAL(s + eps);
                #pragma unroll
                for (int j = 0; j < N; j++)
                    c[i * N + j] = c[i * N + j] * r;
            }
            // col_step
            #pragma unroll
            for (int j = 0; j < N; j++)
            {
                float64 s = ((c[0 * N + j] + c[1 * N + j]) + c[2 * N + j]) + c[3 * N + j];
                float64 r = RECIPROCAL(s + eps);
                #pragma unroll
                for (int i = 0; i < N; i++)
                    c[i * N + j] = c[i * N + j] * r;
            }
        }

        #pragma unroll
        for (int k = 0; k < N * N; k++)
        {
            coord[1] = k;
            v_f32_st_tnsr(coord, comb_out, c[k]);
        }
    }
}
