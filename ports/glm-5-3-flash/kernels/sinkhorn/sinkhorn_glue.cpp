// Graph-compiler glue for the mHC Sinkhorn TPC kernel (sinkhorn_f32.c): tells the Gaudi graph
// compiler the kernel's GUID, checks the tensors and lays out the index space. Built by
// build.sh into libcustom_tpc_glm.so, which the graph compiler loads through GC_KERNEL_PATH.
//
// Interface: tpc_lib_api (tpc_kernel_lib_interface.h from the Gaudi software's TPC SDK). Not
// compiled here (no SDK): see README.md.

#include <cstdint>
#include <cstring>

#include "tpc_kernel_lib_interface.h"

// The kernel ELF, embedded by build.sh (ld -r -b binary sinkhorn_f32_gaudi2.o).
extern unsigned char _binary_sinkhorn_f32_gaudi2_o_start;
extern unsigned char _binary_sinkhorn_f32_gaudi2_o_end;

namespace {

constexpr const char* kGuid = "mhc_sinkhorn_f32_gaudi2";
constexpr int kVec = 64;       // fp32 lanes per TPC vector
constexpr uint64_t kElems = 16;  // one 4 x 4 matrix, flattened along dim1

// Must match the PyTorch glue's params struct (hpu_glm_sinkhorn.cpp) field for field.
struct SinkhornParams {
  float eps;
  int32_t iters;
};

}  // namespace

extern "C" {

tpc_lib_api::GlueCodeReturn GetKernelGuids(_IN_ tpc_lib_api::DeviceId deviceId,
                                           _OUT_ uint32_t* kernelCount,
                                           _OUT_ tpc_lib_api::GuidInfo* guids) {
  if (deviceId != tpc_lib_api::DEVICE_ID_GAUDI2) {
    if (kernelCount) *kernelCount = 0;
    return tpc_lib_api::GLUE_SUCCESS;
  }
  if (guids != nullptr) strcpy(guids[0].name, kGuid);
  if (kernelCount != nullptr) *kernelCount = 1;
  return tpc_lib_api::GLUE_SUCCESS;
}

tpc_lib_api::GlueCodeReturn InstantiateTpcKernel(_IN_ tpc_lib_api::HabanaKernelParams* in,
                                                 _OUT_ tpc_lib_api::HabanaKernelInstantiation* out) {
  if (strcmp(in->guid.name, kGuid) != 0) return tpc_lib_api::GLUE_NODE_NOT_FOUND;

  if (in->inputTensorNr != 1) {
    in->inputTensorNr = 1;
    return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_COUNT;
  }
  if (in->outputTensorNr != 1) {
    in->outputTensorNr = 1;
    return tpc_lib_api::GLUE_INCOMPATIBLE_OUTPUT_COUNT;
  }
  const auto& x = in->inputTensors[0].geometry;
  const auto& y = in->outputTensors[0].geometry;
  if (in->inputTensors[0].geometry.dataType != tpc_lib_api::DATA_F32 ||
      in->outputTensors[0].geometry.dataType != tpc_lib_api::DATA_F32) {
    in->inputTensors[0].geometry.dataType = tpc_lib_api::DATA_F32;
    in->outputTensors[0].geometry.dataType = tpc_lib_api::DATA_F32;
    return tpc_lib_api::GLUE_INCOMPATIBLE_DATA_TYPE;
  }
  // [16, R] in PyTorch order: dim0 (fastest) = R matrices, dim1 = the 16 elements.
  if (x.dims != 2 || x.maxSizes[1] != kElems || y.maxSizes[0] != x.maxSizes[0] || y.maxSizes[1] != kElems)
    return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_SIZE;
  if (in->nodeParams.nodeParams == nullptr || in->nodeParams.nodeParamsSize != sizeof(SinkhornParams))
    return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_SIZE;
  const auto* p = static_cast<const SinkhornParams*>(in->nodeParams.nodeParams);
  if (p->iters < 1) return tpc_lib_api::GLUE_INCOMPATIBLE_INPUT_SIZE;

  // One index-space member per 64 matrices; each member reads and writes all 16 elements.
  out->indexSpaceRank = 1;
  out->indexSpaceGeometry[0] = (x.maxSizes[0] + kVec - 1) / kVec;
  for (auto* pattern : {&out->inputTensorAccessPattern[0], &out->outputTensorAccessPattern[0]}) {
    pattern->mapping[0].indexSpaceDim = 0;
    pattern->mapping[0].a = kVec;
    pattern->mapping[0].start_b = 0;
    pattern->mapping[0].end_b = kVec - 1;
    pattern->mapping[1].indexSpaceDim = 0;  // the whole element axis for every member
    pattern->mapping[1].a = 0;
    pattern->mapping[1].start_b = 0;
    pattern->mapping[1].end_b = kElems - 1;
  }

  // Scalar kernel arguments, in the order of main(): eps, iters.
  out->kernel.paramsNr = 2;
  std::memcpy(&out->kernel.scalarParams[0], &p->eps, sizeof(float));
  std::memcpy(&out->kernel.scalarParams[1], &p->iters, sizeof(int32_t));

  const uint64_t elf = &_binary_sinkhorn_f32_gaudi2_o_end - &_binary_sinkhorn_f32_gaudi2_o_start;
  const uint64_t room = out->kernel.elfSize;
  out->kernel.elfSize = elf;
  if (room < elf) return tpc_lib_api::GLUE_INSUFFICIENT_ELF_BUFFER;
  std::memcpy(out->kernel.kernelElf, &_binary_sinkhorn_f32_gaudi2_o_start, elf);
  return tpc_lib_api::GLUE_SUCCESS;
}

}  // extern "C"
