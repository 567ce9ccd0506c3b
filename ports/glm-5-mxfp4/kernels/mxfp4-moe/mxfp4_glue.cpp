// Graph-compiler glue for the MXFP4 MoE TPC kernels: the GEMV (mxfp4_gemv_bf16.c, GUID
// "glm_mxfp4_gemv_bf16_gaudi2") and the unpack (mxfp4_unpack_bf16.c, GUID
// "glm_mxfp4_unpack_bf16_gaudi2"). It names the kernels, checks tensor types and shapes against
// the kernels' header contracts and lays out their index spaces. Built by build.sh into
// libcustom_tpc_glm_mxfp4.so, which the graph compiler loads through GC_KERNEL_PATH.
//
// Interface: tpc_lib_api (tpc_kernel_lib_interface.h, the Gaudi software's TPC SDK). Not
// compiled here (no SDK): see README.md.

#include <cstdint>
#include <cstring>

#include "tpc_kernel_lib_interface.h"

// The kernel ELFs, embedded by build.sh (ld -r -b binary).
extern unsigned char _binary_mxfp4_gemv_bf16_gaudi2_o_start;
extern unsigned char _binary_mxfp4_gemv_bf16_gaudi2_o_end;
extern unsigned char _binary_mxfp4_unpack_bf16_gaudi2_o_start;
extern unsigned char _binary_mxfp4_unpack_bf16_gaudi2_o_end;

namespace {

constexpr const char* kGemv = "glm_mxfp4_gemv_bf16_gaudi2";
constexpr const char* kUnpack = "glm_mxfp4_unpack_bf16_gaudi2";
constexpr uint64_t kBlock = 32;      // elements per E8M0 scale
constexpr uint64_t kMaxTokens = 16;  // MXK_MAX_TOKENS in mxfp4_gemv_bf16.c
constexpr uint64_t kUnpackBytes = 256;

// Must match the PyTorch op's params struct (hpu_glm_mxfp4.cpp) field for field.
struct GemvParams {
  int32_t k_elems;
  int32_t tokens;
};

using tpc_lib_api::GlueCodeReturn;

GlueCodeReturn embed(tpc_lib_api::HabanaKernelInstantiation* out, const unsigned char* start, const unsigned char* end) {
  const uint64_t elf = static_cast<uint64_t>(end - start);
  const uint64_t room = out->kernel.elfSize;
  out->kernel.elfSize = elf;
  if (room < elf) return tpc_lib_api::GLUE_INSUFFICIENT_ELF_BUFFER;
  std::memcpy(out->kernel.kernelElf, start, elf);
  return tpc_lib_api::GLUE_SUCCESS;
}

bool is(const tpc_lib_api::Tensor& t, tpc_lib_api::TensorDataType type, uint32_t dims) {
  return t.geometry.dataType == type && t.geometry.dims == dims;
}

// xs f32 [K/2, 2, T], packed u8 [K/2, N], scales u8 [K/32, N] -> y bf16 [T, N] (TPC order).
GlueCodeReturn gemv(tpc_lib_api::HabanaKernelParams* in, tpc_lib_api::HabanaKernelInstantiation* out) {
  if (in->inputTensorNr != 3) { in->inputTensorNr = 3; return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_COUNT; }
  if (in->outputTensorNr != 1) { in->outputTensorNr = 1; return tpc_lib_api::GLUE_INCOMPATIBLE_OUTPUT_COUNT; }
  const auto& xs = in->inputTensors[0];
  const auto& w = in->inputTensors[1];
  const auto& s = in->inputTensors[2];
  const auto& y = in->outputTensors[0];
  if (!is(xs, tpc_lib_api::DATA_F32, 3) || !is(w, tpc_lib_api::DATA_U8, 2) || !is(s, tpc_lib_api::DATA_U8, 2) ||
      !is(y, tpc_lib_api::DATA_BF16, 2))
    return tpc_lib_api::GLUE_INCOMPATIBLE_DATA_TYPE;
  const uint64_t half_k = w.geometry.maxSizes[0], n = w.geometry.maxSizes[1], t = xs.geometry.maxSizes[2];
  if (xs.geometry.maxSizes[0] != half_k || xs.geometry.maxSizes[1] != 2 || (2 * half_k) % kBlock != 0 ||
      s.geometry.maxSizes[0] != 2 * half_k / kBlock || s.geometry.maxSizes[1] != n ||
      y.geometry.maxSizes[0] != t || y.geometry.maxSizes[1] != n || t < 1 || t > kMaxTokens)
    return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_SIZE;
  if (in->nodeParams.nodeParams == nullptr || in->nodeParams.nodeParamsSize != sizeof(GemvParams))
    return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_SIZE;
  const auto* p = static_cast<const GemvParams*>(in->nodeParams.nodeParams);
  if (static_cast<uint64_t>(p->k_elems) != 2 * half_k || static_cast<uint64_t>(p->tokens) != t)
    return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_SIZE;

  // One member per output row; each reads its whole row of weights and every token.
  out->indexSpaceRank = 1;
  out->indexSpaceGeometry[0] = n;
  auto whole = [](tpc_lib_api::TensorAccessPattern& a, unsigned dim, uint64_t size) {
    a.mapping[dim].indexSpaceDim = 0;
    a.mapping[dim].a = 0;
    a.mapping[dim].start_b = 0;
    a.mapping[dim].end_b = size - 1;
  };
  auto per_row = [](tpc_lib_api::TensorAccessPattern& a, unsigned dim) {
    a.mapping[dim].indexSpaceDim = 0;
    a.mapping[dim].a = 1;
    a.mapping[dim].start_b = 0;
    a.mapping[dim].end_b = 0;
  };
  whole(out->inputTensorAccessPattern[0], 0, half_k);
  whole(out->inputTensorAccessPattern[0], 1, 2);
  whole(out->inputTensorAccessPattern[0], 2, t);
  whole(out->inputTensorAccessPattern[1], 0, half_k);
  per_row(out->inputTensorAccessPattern[1], 1);
  whole(out->inputTensorAccessPattern[2], 0, s.geometry.maxSizes[0]);
  per_row(out->inputTensorAccessPattern[2], 1);
  whole(out->outputTensorAccessPattern[0], 0, t);
  per_row(out->outputTensorAccessPattern[0], 1);

  // Scalar arguments in the order of main(): k_elems, tokens.
  out->kernel.paramsNr = 2;
  std::memcpy(&out->kernel.scalarParams[0], &p->k_elems, sizeof(int32_t));
  std::memcpy(&out->kernel.scalarParams[1], &p->tokens, sizeof(int32_t));
  return embed(out, &_binary_mxfp4_gemv_bf16_gaudi2_o_start, &_binary_mxfp4_gemv_bf16_gaudi2_o_end);
}

// packed u8 [K/2, N], scales u8 [K/32, N] -> out i32 [K/2, N] (TPC order).
GlueCodeReturn unpack(tpc_lib_api::HabanaKernelParams* in, tpc_lib_api::HabanaKernelInstantiation* out) {
  if (in->inputTensorNr != 2) { in->inputTensorNr = 2; return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_COUNT; }
  if (in->outputTensorNr != 1) { in->outputTensorNr = 1; return tpc_lib_api::GLUE_INCOMPATIBLE_OUTPUT_COUNT; }
  const auto& w = in->inputTensors[0];
  const auto& s = in->inputTensors[1];
  const auto& o = in->outputTensors[0];
  if (!is(w, tpc_lib_api::DATA_U8, 2) || !is(s, tpc_lib_api::DATA_U8, 2) || !is(o, tpc_lib_api::DATA_I32, 2))
    return tpc_lib_api::GLUE_INCOMPATIBLE_DATA_TYPE;
  const uint64_t half_k = w.geometry.maxSizes[0], n = w.geometry.maxSizes[1];
  if ((2 * half_k) % kBlock != 0 || s.geometry.maxSizes[0] != 2 * half_k / kBlock || s.geometry.maxSizes[1] != n ||
      o.geometry.maxSizes[0] != half_k || o.geometry.maxSizes[1] != n)
    return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_SIZE;

  // Members of 256 bytes (16 scale codes) along dim0, one row each along dim1.
  out->indexSpaceRank = 2;
  out->indexSpaceGeometry[0] = (half_k + kUnpackBytes - 1) / kUnpackBytes;
  out->indexSpaceGeometry[1] = n;
  for (auto* a : {&out->inputTensorAccessPattern[0], &out->outputTensorAccessPattern[0]}) {
    a->mapping[0].indexSpaceDim = 0;
    a->mapping[0].a = kUnpackBytes;
    a->mapping[0].start_b = 0;
    a->mapping[0].end_b = kUnpackBytes - 1;
  }
  out->inputTensorAccessPattern[1].mapping[0].indexSpaceDim = 0;
  out->inputTensorAccessPattern[1].mapping[0].a = kUnpackBytes * 2 / kBlock;
  out->inputTensorAccessPattern[1].mapping[0].start_b = 0;
  out->inputTensorAccessPattern[1].mapping[0].end_b = kUnpackBytes * 2 / kBlock - 1;
  for (auto* a : {&out->inputTensorAccessPattern[0], &out->inputTensorAccessPattern[1], &out->outputTensorAccessPattern[0]}) {
    a->mapping[1].indexSpaceDim = 1;
    a->mapping[1].a = 1;
    a->mapping[1].start_b = 0;
    a->mapping[1].end_b = 0;
  }
  out->kernel.paramsNr = 0;
  return embed(out, &_binary_mxfp4_unpack_bf16_gaudi2_o_start, &_binary_mxfp4_unpack_bf16_gaudi2_o_end);
}

}  // namespace

extern "C" {

tpc_lib_api::GlueCodeReturn GetKernelGuids(_IN_ tpc_lib_api::DeviceId deviceId, _OUT_ uint32_t* kernelCount,
                                           _OUT_ tpc_lib_api::GuidInfo* guids) {
  if (deviceId != tpc_lib_api::DEVICE_ID_GAUDI2) {
    if (kernelCount) *kernelCount = 0;
    return tpc_lib_api::GLUE_SUCCESS;
  }
  if (guids != nullptr) {
    strcpy(guids[0].name, kGemv);
    strcpy(guids[1].name, kUnpack);
  }
  if (kernelCount != nullptr) *kernelCount = 2;
  return tpc_lib_api::GLUE_SUCCESS;
}

tpc_lib_api::GlueCodeReturn InstantiateTpcKernel(_IN_ tpc_lib_api::HabanaKernelParams* in,
                                                 _OUT_ tpc_lib_api::HabanaKernelInstantiation* out) {
  if (strcmp(in->guid.name, kGemv) == 0) return gemv(in, out);
  if (strcmp(in->guid.name, kUnpack) == 0) return unpack(in, out);
  return tpc_lib_api::GLUE_NODE_NOT_FOUND;
}

}  // extern "C"
