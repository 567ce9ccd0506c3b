/*
 * The TPC-C names sinkhorn_f32.c uses, for compiling that file unchanged on the host (gcc/clang
 * vector extensions), so its arithmetic can be run and compared bit for bit on a CPU.
 *
 * float64: a 64-lane fp32 vector; int5: the 5-D tensor coordinate (8 ints, 5 used); tensor: a
 * [16, R] fp32 tensor with dim0 (the matrix index r) innermost, as the op hands it to the kernel.
 * Loads past R read 0 (the tensor's padding); stores past R are dropped. The index space is set
 * by the driver (host_driver.c). Every vector operation is lane-wise IEEE fp32 with one rounding
 * (compile with -ffp-contract=off, as build.sh compiles the kernel). RECIPROCAL is 1/x, correctly
 * rounded: the host's stand-in for the TPC's v_reciprocal_f32 (the device gate measures that one).
 */
#ifndef TPC_HOST_H
#define TPC_HOST_H

#define VEC_LANES 64

typedef float float64 __attribute__((vector_size(VEC_LANES * sizeof(float))));
typedef int int5 __attribute__((vector_size(8 * sizeof(int))));

typedef struct {
    float *data;
    int rows;   /* R: matrices (dim0 extent) */
    int inner;  /* 16: elements per matrix (dim1 extent) */
} host_tensor;
typedef host_tensor *tensor;

static int5 host_index_offset;
static int5 host_index_size;

static inline int5 get_index_space_offset(void) { return host_index_offset; }
static inline int5 get_index_space_size(void) { return host_index_size; }

static inline float64 v_f32_ld_tnsr_b(int5 coord, tensor t)
{
    float64 v;
    for (int l = 0; l < VEC_LANES; l++) {
        int r = coord[0] + l;
        v[l] = (r < t->rows && coord[1] < t->inner) ? t->data[(long)coord[1] * t->rows + r] : 0.0f;
    }
    return v;
}

static inline void v_f32_st_tnsr(int5 coord, tensor t, float64 v)
{
    for (int l = 0; l < VEC_LANES; l++) {
        int r = coord[0] + l;
        if (r < t->rows && coord[1] < t->inner)
            t->data[(long)coord[1] * t->rows + r] = v[l];
    }
}

#define RECIPROCAL(x) (1.0f / (x))

#endif
