// A host stand-in for the TPC-C vector types and the intrinsics the MXFP4 MoE kernels use, so
// that the kernel sources in kernels/mxfp4-moe/ compile unchanged with g++ and run on a CPU
// (tests/test_glm5_hpu_mxk.py). Each intrinsic does here what the kernels' comments assume it
// does on the card (lane-wise IEEE float32, int32 wrap-around, zero padding outside a tensor,
// stores outside a tensor dropped); whether the card agrees is the device gate's question.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

constexpr int kLanes = 64;

struct int64 {  // 64 int32 lanes
  int32_t v[kLanes];
  int64() { std::memset(v, 0, sizeof v); }
  int64(int32_t s) { for (auto& x : v) x = s; }  // NOLINT: broadcast, as TPC-C allows
  int32_t& operator[](int i) { return v[i]; }
  int32_t operator[](int i) const { return v[i]; }
};
struct float64 {  // 64 float32 lanes
  float v[kLanes];
  float64() { std::memset(v, 0, sizeof v); }
  float64(float s) { for (auto& x : v) x = s; }  // NOLINT
};
struct uchar256 { uint8_t v[256]; };
struct bf16x64 { uint16_t v[kLanes]; };
struct int5 {
  int32_t v[5];
  int32_t& operator[](int i) { return v[i]; }
  int32_t operator[](int i) const { return v[i]; }
};
inline int5 operator+(const int5& a, const int5& b) {
  int5 r;
  for (int i = 0; i < 5; i++) r.v[i] = a.v[i] + b.v[i];
  return r;
}

#define SHIM_I32_OP(op)                                                              \
  inline int64 operator op(const int64& a, const int64& b) {                         \
    int64 r;                                                                         \
    for (int i = 0; i < kLanes; i++)                                                 \
      r.v[i] = (int32_t)((uint32_t)a.v[i] op (uint32_t)b.v[i]);                      \
    return r;                                                                        \
  }                                                                                  \
  inline int64 operator op(const int64& a, int32_t b) { return a op int64(b); }     \
  inline int64 operator op(int32_t a, const int64& b) { return int64(a) op b; }
SHIM_I32_OP(+)
SHIM_I32_OP(-)
SHIM_I32_OP(*)
SHIM_I32_OP(&)
SHIM_I32_OP(|)
inline int64 operator<<(const int64& a, const int64& b) {
  int64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = (int32_t)((uint32_t)a.v[i] << (b.v[i] & 31));
  return r;
}
inline int64 operator<<(const int64& a, int32_t b) { return a << int64(b); }
inline int64 operator>>(const int64& a, int32_t b) {  // arithmetic, as on int32 lanes
  int64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = a.v[i] >> b;
  return r;
}
inline float64 operator+(const float64& a, const float64& b) {
  float64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = a.v[i] + b.v[i];
  return r;
}
inline float64 operator*(const float64& a, const float64& b) {
  float64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = a.v[i] * b.v[i];
  return r;
}

// Lane-wise selects, the names the kernels' macros default to.
inline int64 v_i32_sel_grt_i32_b(const int64& a, const int64& b, const int64& x, const int64& y) {
  int64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = a.v[i] > b.v[i] ? x.v[i] : y.v[i];
  return r;
}
inline int64 v_i32_sel_eq_i32_b(const int64& a, const int64& b, const int64& x, const int64& y) {
  int64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = a.v[i] == b.v[i] ? x.v[i] : y.v[i];
  return r;
}
inline float64 v_f32_sel_eq_i32_b(const int64& a, const int64& b, const float64& x, const float64& y) {
  float64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = a.v[i] == b.v[i] ? x.v[i] : y.v[i];
  return r;
}
inline float64 v_f32_sel_less_i32_b(const int64& a, const int64& b, const float64& x, const float64& y) {
  float64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = a.v[i] < b.v[i] ? x.v[i] : y.v[i];
  return r;
}

constexpr int SW_RHNE = 0;  // round half to nearest even
inline int64 v_convert_u8_to_i32_b(const uchar256& v, int switches) {  // quarter = switches >> 8
  int64 r;
  const int q = switches >> 8;
  for (int i = 0; i < kLanes; i++) r.v[i] = v.v[q * kLanes + i];
  return r;
}
inline int64 read_lane_id_4b_b() {
  int64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = i;
  return r;
}
inline int64 v_i32_shuffle_b(const int64& v, const int64& src) {
  int64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = v.v[src.v[i] & (kLanes - 1)];
  return r;
}
inline float64 v_f32_shuffle_b(const float64& v, const int64& src) {
  float64 r;
  for (int i = 0; i < kLanes; i++) r.v[i] = v.v[src.v[i] & (kLanes - 1)];
  return r;
}
inline bf16x64 v_convert_f32_to_bf16_all_b(const float64& v, int) {  // nearest even; NaN stays NaN
  bf16x64 r;
  for (int i = 0; i < kLanes; i++) {
    uint32_t b;
    std::memcpy(&b, &v.v[i], 4);
    r.v[i] = std::isnan(v.v[i]) ? (uint16_t)((b >> 16) | 0x40) : (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
  }
  return r;
}

// Tensors: dim0 fastest; reads outside are 0, writes outside are dropped.
struct TensorDesc {
  void* data;
  int elem;
  int dims;
  int64_t size[5];
};
using tensor = TensorDesc*;
inline bool shim_offset(const TensorDesc* t, const int5& c, int64_t lane0, int64_t* off) {
  int64_t o = 0, stride = 1;
  for (int d = 0; d < 5; d++) {
    const int64_t i = (d == 0 ? lane0 : c.v[d]);
    const int64_t n = d < t->dims ? t->size[d] : 1;
    if (i < 0 || i >= n) return false;
    o += i * stride;
    stride *= n;
  }
  *off = o;
  return true;
}
template <typename T, int N>
inline void shim_load(const int5& c, const TensorDesc* t, T* out) {
  for (int i = 0; i < N; i++) {
    int64_t o;
    out[i] = shim_offset(t, c, (int64_t)c.v[0] + i, &o) ? static_cast<const T*>(t->data)[o] : T(0);
  }
}
template <typename T, int N>
inline void shim_store(const int5& c, TensorDesc* t, const T* in) {
  for (int i = 0; i < N; i++) {
    int64_t o;
    if (shim_offset(t, c, (int64_t)c.v[0] + i, &o)) static_cast<T*>(t->data)[o] = in[i];
  }
}
inline uchar256 v_u8_ld_tnsr_b(const int5& c, tensor t) { uchar256 r; shim_load<uint8_t, 256>(c, t, r.v); return r; }
inline float64 v_f32_ld_tnsr_b(const int5& c, tensor t) { float64 r; shim_load<float, kLanes>(c, t, r.v); return r; }
inline void v_i32_st_tnsr(const int5& c, tensor t, const int64& v) { shim_store<int32_t, kLanes>(c, t, v.v); }
inline void v_bf16_st_tnsr_partial(const int5& c, tensor t, const bf16x64& v) { shim_store<uint16_t, kLanes>(c, t, v.v); }
// The harness's float32 mode (F32_OUT, with F32_TO_BF16_RNE the identity) stores the sums
// before the bf16 rounding, so a test can compare the kernel's order itself.
inline void v_bf16_st_tnsr_partial(const int5& c, tensor t, const float64& v) { shim_store<float, kLanes>(c, t, v.v); }

// The index space of the one launch the harness makes.
inline int5 g_index_offset{}, g_index_size{};
inline int5 get_index_space_offset() { return g_index_offset; }
inline int5 get_index_space_size() { return g_index_size; }
