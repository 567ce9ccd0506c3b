// PyTorch ops on HPU for the MXFP4 MoE TPC kernels, through the Habana custom-op API
// (hpu_custom_op_pt2.h). Built by build.sh into libhpu_glm_mxfp4.so and loaded by op.py.
//
//   hpu_glm::mxfp4_gemv(Tensor x, Tensor packed, Tensor scales) -> Tensor
//       x bf16 [T, K] (T <= 16), packed u8 [N, K/2], scales u8 [N, K/32] -> bf16 [T, N]
//       (kernel "glm_mxfp4_gemv_bf16_gaudi2", mxfp4_gemv_bf16.c)
//   hpu_glm::mxfp4_unpack(Tensor packed, Tensor scales) -> Tensor
//       packed u8 [N, K/2], scales u8 [N, K/32] -> bf16 [N, K]
//       (kernel "glm_mxfp4_unpack_bf16_gaudi2", mxfp4_unpack_bf16.c)
//
// Not compiled here (no Gaudi software): see README.md.

#include <torch/extension.h>

#include "hpu_custom_op_pt2.h"

namespace {

constexpr const char* kGemvInner = "hpu_glm::mxfp4_gemv_tpc";
constexpr const char* kGemvGuid = "glm_mxfp4_gemv_bf16_gaudi2";
constexpr const char* kUnpackInner = "hpu_glm::mxfp4_unpack_tpc";
constexpr const char* kUnpackGuid = "glm_mxfp4_unpack_bf16_gaudi2";
constexpr int64_t kBlock = 32;
constexpr int64_t kMaxTokens = 16;  // MXK_MAX_TOKENS in mxfp4_gemv_bf16.c

// Must match GemvParams in mxfp4_glue.cpp.
struct GemvParams {
  int32_t k_elems;
  int32_t tokens;
};

// inputs: xs f32 [T, 2, K/2], packed, scales, k, t -> y bf16 [N, T]
habana::PartialOutputMetaDataVector gemv_meta(const at::Stack& inputs) {
  auto xs = inputs[0].toTensor();
  auto w = inputs[1].toTensor();
  return {habana::PartialOutputMetaData{c10::ScalarType::BFloat16, {w.size(0), xs.size(0)}}};
}

std::shared_ptr<void> gemv_params(const at::Stack& inputs, size_t& size) {
  HPU_PARAMS_STUB(GemvParams);
  params->k_elems = static_cast<int32_t>(inputs[3].toInt());
  params->tokens = static_cast<int32_t>(inputs[4].toInt());
  return params;
}

// inputs: packed, scales -> i32 [N, K/2], one word per packed byte
habana::PartialOutputMetaDataVector unpack_meta(const at::Stack& inputs) {
  auto w = inputs[0].toTensor();
  return {habana::PartialOutputMetaData{c10::ScalarType::Int, w.sizes().vec()}};
}

// The unpack kernel takes no scalar parameters.
std::shared_ptr<void> unpack_params(const at::Stack&, size_t& size) {
  size = 0;
  return nullptr;
}

bool register_inner() {
  habana::custom_op::registerUserCustomOp(kGemvInner, kGemvGuid, gemv_meta, gemv_params);
  habana::custom_op::registerUserCustomOp(kUnpackInner, kUnpackGuid, unpack_meta, unpack_params);
  return true;
}

void check_weights(const char* op, const at::Tensor& packed, const at::Tensor& scales) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && scales.scalar_type() == at::kByte, op,
              ": packed and scales must be uint8, got ", packed.scalar_type(), " and ", scales.scalar_type());
  TORCH_CHECK(packed.dim() == 2 && scales.dim() == 2 && scales.size(0) == packed.size(0) &&
                  scales.size(1) * kBlock == packed.size(1) * 2,
              op, ": packed [N, K/2] and scales [N, K/32] do not match: ", packed.sizes(), " and ", scales.sizes());
}

at::Tensor gemv_tpc(at::Tensor xs, at::Tensor packed, at::Tensor scales, int64_t k, int64_t t) {
  auto desc = habana::custom_op::UserCustomOpDescriptor::getUserCustomOpDescriptor(kGemvInner);
  std::vector<c10::IValue> inputs{xs, packed, scales, k, t};
  return desc.execute(inputs)[0];
}

at::Tensor unpack_tpc(at::Tensor packed, at::Tensor scales) {
  auto desc = habana::custom_op::UserCustomOpDescriptor::getUserCustomOpDescriptor(kUnpackInner);
  std::vector<c10::IValue> inputs{packed, scales};
  return desc.execute(inputs)[0];
}

at::Tensor mxfp4_gemv_hpu(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  check_weights("hpu_glm::mxfp4_gemv", packed, scales);
  const int64_t k = packed.size(1) * 2;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == k,
              "hpu_glm::mxfp4_gemv: x must be bf16 [T, ", k, "], got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= kMaxTokens, "hpu_glm::mxfp4_gemv: 1 to ", kMaxTokens,
              " tokens (decode-sized calls), got ", x.size(0));
  // x[t, 2j + h] -> xs[t, h, j]: lane j of the kernel reads its low and high element's activation.
  auto xs = x.to(at::kFloat).view({x.size(0), k / 2, 2}).transpose(1, 2).contiguous();
  auto y = gemv_tpc(xs, packed.contiguous(), scales.contiguous(), k, x.size(0));
  return y.t().contiguous();
}

at::Tensor mxfp4_unpack_hpu(const at::Tensor& packed, const at::Tensor& scales) {
  check_weights("hpu_glm::mxfp4_unpack", packed, scales);
  auto words = unpack_tpc(packed.contiguous(), scales.contiguous());
  return words.view(at::kBFloat16);  // [N, K/2] int32 -> [N, K] bf16, element 2j first
}

at::Tensor mxfp4_gemv_meta(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  return at::empty({x.size(0), packed.size(0)}, x.options().dtype(at::kBFloat16));
}

at::Tensor mxfp4_unpack_meta(const at::Tensor& packed, const at::Tensor& scales) {
  return at::empty({packed.size(0), packed.size(1) * 2}, packed.options().dtype(at::kBFloat16));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(hpu_glm, m) {
  m.def("mxfp4_gemv(Tensor x, Tensor packed, Tensor scales) -> Tensor");
  m.def("mxfp4_unpack(Tensor packed, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(hpu_glm, HPU, m) {
  m.impl("mxfp4_gemv", mxfp4_gemv_hpu);
  m.impl("mxfp4_unpack", mxfp4_unpack_hpu);
}

TORCH_LIBRARY_IMPL(hpu_glm, Meta, m) {
  m.impl("mxfp4_gemv", mxfp4_gemv_meta);
  m.impl("mxfp4_unpack", mxfp4_unpack_meta);
}

static const bool kRegistered = register_inner();
