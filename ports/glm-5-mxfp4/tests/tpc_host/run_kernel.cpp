// Runs one MXFP4 MoE kernel source (kernels/mxfp4-moe/, compiled unchanged against
// tpc_shim.hpp) over one whole index space on the host, from raw files, for the CPU tests.
//
//   g++ -DGEMV ... run_kernel.cpp -o gemv      gemv N K T xs.f32 packed.u8 scales.u8 y.bf16
//   (with -DF32_OUT '-DF32_TO_BF16_RNE(v)=(v)': y is the float32 sums before the bf16 store)
//   g++ ... run_kernel.cpp -o unpack            unpack N K packed.u8 scales.u8 out.i32
//
// xs is the op's de-interleaved fp32 [T, 2, K/2] (PyTorch order); y is bf16 bits [N, T] and
// out is int32 [N, K/2] (PyTorch order), as the op's glue hands them to the kernel.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tpc_shim.hpp"

#define main tpc_main
#ifdef GEMV
#include "mxfp4_gemv_bf16.c"
#else
#include "mxfp4_unpack_bf16.c"
#endif
#undef main

namespace {

template <typename T>
std::vector<T> read_all(const char* path, size_t count) {
  std::vector<T> v(count);
  FILE* f = std::fopen(path, "rb");
  if (!f || std::fread(v.data(), sizeof(T), count, f) != count) {
    std::fprintf(stderr, "run_kernel: cannot read %zu items from %s\n", count, path);
    std::exit(2);
  }
  std::fclose(f);
  return v;
}

template <typename T>
void write_all(const char* path, const std::vector<T>& v) {
  FILE* f = std::fopen(path, "wb");
  if (!f || std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) {
    std::fprintf(stderr, "run_kernel: cannot write %s\n", path);
    std::exit(2);
  }
  std::fclose(f);
}

TensorDesc desc(void* data, int elem, int dims, int64_t d0, int64_t d1, int64_t d2 = 1) {
  return TensorDesc{data, elem, dims, {d0, d1, d2, 1, 1}};
}

}  // namespace

int main(int argc, char** argv) {
#ifdef GEMV
  if (argc != 8) {
    std::fprintf(stderr, "usage: gemv N K T xs packed scales y\n");
    return 2;
  }
  const int64_t n = std::atoll(argv[1]), k = std::atoll(argv[2]), t = std::atoll(argv[3]);
  auto xs = read_all<float>(argv[4], t * k);
  auto packed = read_all<uint8_t>(argv[5], n * k / 2);
  auto scales = read_all<uint8_t>(argv[6], n * k / 32);
#ifdef F32_OUT
  std::vector<float> y(n * t, -1.0f);
#else
  std::vector<uint16_t> y(n * t, 0xFFFF);
#endif
  TensorDesc txs = desc(xs.data(), 4, 3, k / 2, 2, t), tw = desc(packed.data(), 1, 2, k / 2, n),
             ts = desc(scales.data(), 1, 2, k / 32, n), ty = desc(y.data(), sizeof(y[0]), 2, t, n);
  g_index_offset = int5{{0, 0, 0, 0, 0}};
  g_index_size = int5{{static_cast<int32_t>(n), 1, 1, 1, 1}};
  tpc_main(&txs, &tw, &ts, &ty, static_cast<int>(k), static_cast<int>(t));
  write_all(argv[7], y);
#else
  if (argc != 6) {
    std::fprintf(stderr, "usage: unpack N K packed scales out\n");
    return 2;
  }
  const int64_t n = std::atoll(argv[1]), k = std::atoll(argv[2]);
  auto packed = read_all<uint8_t>(argv[3], n * k / 2);
  auto scales = read_all<uint8_t>(argv[4], n * k / 32);
  std::vector<int32_t> out(n * k / 2, 0x7FFFFFFF);
  TensorDesc tw = desc(packed.data(), 1, 2, k / 2, n), ts = desc(scales.data(), 1, 2, k / 32, n),
             to = desc(out.data(), 4, 2, k / 2, n);
  g_index_offset = int5{{0, 0, 0, 0, 0}};
  g_index_size = int5{{static_cast<int32_t>((k / 2 + 255) / 256), static_cast<int32_t>(n), 1, 1, 1}};
  tpc_main(&tw, &ts, &to);
  write_all(argv[5], out);
#endif
  return 0;
}
