/*
 * Host driver for sinkhorn_f32.c: the kernel source is included unchanged (its `main` renamed),
 * and sinkhorn_host runs it over the index space the glue gives it (dim0 = ceil(R / 64)).
 * in/out: [16, R] fp32, element k = 4*i + j of matrix r at [k, r] (the op's transpose).
 */
#include "tpc_host.h"

#define main sinkhorn_f32_kernel
#include "../sinkhorn_f32.c"
#undef main

void sinkhorn_host(float *in, float *out, int rows, float eps, int iters)
{
    host_tensor tin = {in, rows, 16}, tout = {out, rows, 16};
    int5 zero = {0, 0, 0, 0, 0};
    int5 size = {(rows + VEC_LANES - 1) / VEC_LANES, 1, 1, 1, 1};
    host_index_offset = zero;
    host_index_size = size;
    sinkhorn_f32_kernel(&tin, &tout, eps, iters);
}
