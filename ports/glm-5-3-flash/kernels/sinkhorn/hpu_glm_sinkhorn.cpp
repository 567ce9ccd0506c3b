// PyTorch op hpu_glm::mhc_sinkhorn(Tensor comb, float eps, int iters) -> Tensor, on HPU, backed
// by the TPC kernel "mhc_sinkhorn_f32_gaudi2" (sinkhorn_f32.c) through the Habana custom-op
// API (hpu_custom_op_pt2.h). comb is fp32 [..., 4, 4]; the result has its shape. Built by
// build.sh into libhpu_glm_sinkhorn.so and loaded by op.py (torch.ops.load_library).
//
// Not compiled here (no Gaudi software): see README.md.

#include <torch/extension.h>

#include "hpu_custom_op_pt2.h"

namespace {

constexpr const char* kInner = "hpu_glm::mhc_sinkhorn_tpc";
constexpr const char* kGuid = "mhc_sinkhorn_f32_gaudi2";

// Must match SinkhornParams in sinkhorn_glue.cpp.
struct SinkhornParams {
  float eps;
  int32_t iters;
};

habana::PartialOutputMetaDataVector inner_meta(const at::Stack& inputs) {
  auto x = inputs[0].toTensor();
  return {habana::PartialOutputMetaData{c10::ScalarType::Float, x.sizes().vec()}};
}

std::shared_ptr<void> inner_params(const at::Stack& inputs, size_t& size) {
  HPU_PARAMS_STUB(SinkhornParams);
  params->eps = static_cast<float>(inputs[1].toDouble());
  params->iters = static_cast<int32_t>(inputs[2].toInt());
  return params;
}

bool register_inner() {
  habana::custom_op::registerUserCustomOp(kInner, kGuid, inner_meta, inner_params);
  return true;
}

at::Tensor mhc_sinkhorn_tpc(at::Tensor x, double eps, int64_t iters) {
  auto desc = habana::custom_op::UserCustomOpDescriptor::getUserCustomOpDescriptor(kInner);
  std::vector<c10::IValue> inputs{x, eps, iters};
  return desc.execute(inputs)[0];
}

at::Tensor mhc_sinkhorn_hpu(const at::Tensor& comb, double eps, int64_t iters) {
  TORCH_CHECK(comb.scalar_type() == at::kFloat, "hpu_glm::mhc_sinkhorn: comb must be float32, got ", comb.scalar_type());
  TORCH_CHECK(comb.dim() >= 2 && comb.size(-1) == 4 && comb.size(-2) == 4,
              "hpu_glm::mhc_sinkhorn: comb must be [..., 4, 4], got ", comb.sizes());
  TORCH_CHECK(iters >= 1, "hpu_glm::mhc_sinkhorn: iters must be >= 1");
  // [R, 16] -> [16, R]: one lane per matrix in the kernel (see sinkhorn_f32.c).
  auto flat = comb.reshape({-1, 16}).t().contiguous();
  auto out = mhc_sinkhorn_tpc(flat, eps, iters);
  return out.t().contiguous().view(comb.sizes());
}

at::Tensor mhc_sinkhorn_meta(const at::Tensor& comb, double eps, int64_t iters) {
  return at::empty_like(comb);
}

at::Tensor mhc_sinkhorn_tpc_meta(at::Tensor x, double eps, int64_t iters) {
  return at::empty_like(x);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(hpu_glm, m) {
  m.def("mhc_sinkhorn(Tensor comb, float eps, int iters) -> Tensor");
  m.def("mhc_sinkhorn_tpc(Tensor x, float eps, int iters) -> Tensor");
}

TORCH_LIBRARY_IMPL(hpu_glm, HPU, m) {
  m.impl("mhc_sinkhorn", mhc_sinkhorn_hpu);
  m.impl("mhc_sinkhorn_tpc", mhc_sinkhorn_tpc);
}

TORCH_LIBRARY_IMPL(hpu_glm, Meta, m) {
  m.impl("mhc_sinkhorn", mhc_sinkhorn_meta);
  m.impl("mhc_sinkhorn_tpc", mhc_sinkhorn_tpc_meta);
}

static const bool kRegistered = register_inner();
