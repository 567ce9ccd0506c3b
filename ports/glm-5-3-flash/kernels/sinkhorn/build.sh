#!/usr/bin/env bash
# Build the mHC Sinkhorn TPC kernel and its PyTorch op on a Gaudi software image.
#
#   ports/glm-5-3-flash/kernels/sinkhorn/build.sh [--check]
#
# Produces, in build/ beside this script:
#   sinkhorn_f32_gaudi2.o     the TPC kernel (tpc-clang -march=gaudi2)
#   libcustom_tpc_glm.so      graph-compiler glue + embedded kernel (loaded via GC_KERNEL_PATH)
#   libhpu_glm_sinkhorn.so    the PyTorch op hpu_glm::mhc_sinkhorn (loaded by op.py)
#
# --check only looks for the toolchain and says what is missing.
# Exit codes: 0 built (or --check: toolchain present); 3 toolchain or Gaudi software missing
# (nothing built); 4 a build step failed.
#
# Environment: TPC_CLANG (default: tpc-clang on PATH, then /usr/bin/tpc-clang and the Habana
# TPC SDK locations), TPC_INCLUDE (folder holding tpc_kernel_lib_interface.h), HABANA_INCLUDE
# (folder holding hpu_custom_op_pt2.h; default /usr/include/habanalabs), PYTHON (default python3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/build"
PYTHON="${PYTHON:-python3}"
CHECK=0
[[ "${1:-}" == "--check" ]] && CHECK=1

missing=()
find_tpc_clang() {
  if [[ -n "${TPC_CLANG:-}" ]]; then [[ -x "$TPC_CLANG" ]] && { echo "$TPC_CLANG"; return; }; return; fi
  command -v tpc-clang 2>/dev/null && return
  for c in /usr/bin/tpc-clang /opt/habanalabs/tpc_llvm/bin/tpc-clang /usr/lib/habanalabs/tpc_llvm/bin/tpc-clang; do
    [[ -x "$c" ]] && { echo "$c"; return; }
  done
}
TPC="$(find_tpc_clang || true)"
[[ -z "$TPC" ]] && missing+=("tpc-clang (the Habana TPC-C compiler; set TPC_CLANG=/path/to/tpc-clang)")

find_header() {  # $1 header, $2.. candidate folders
  local h="$1"; shift
  for d in "$@"; do [[ -n "$d" && -f "$d/$h" ]] && { echo "$d"; return; }; done
}
TPC_INC="$(find_header tpc_kernel_lib_interface.h "${TPC_INCLUDE:-}" /usr/include/habanalabs /usr/lib/habanalabs/include /opt/habanalabs/include || true)"
[[ -z "$TPC_INC" ]] && missing+=("tpc_kernel_lib_interface.h (TPC SDK glue headers; set TPC_INCLUDE)")
HB_INC="$(find_header hpu_custom_op_pt2.h "${HABANA_INCLUDE:-}" /usr/include/habanalabs || true)"
[[ -z "$HB_INC" ]] && missing+=("hpu_custom_op_pt2.h (Habana PyTorch custom-op headers; set HABANA_INCLUDE)")
if ! "$PYTHON" -c "import habana_frameworks.torch.utils.lib_utils" >/dev/null 2>&1; then
  missing+=("habana_frameworks (the Gaudi PyTorch bridge) in $PYTHON")
fi
command -v "${CXX:-g++}" >/dev/null 2>&1 || missing+=("a C++ compiler (${CXX:-g++})")

if (( ${#missing[@]} )); then
  echo "sinkhorn kernel: cannot build here; missing:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  echo "Build it inside a Gaudi software image (the stock vllm-gaudi v0.26.0 image, Gaudi SW 1.24.1)," >&2
  echo "or serve with GLM5_NEXT_MHC_SINKHORN=torch (the reference path, no kernel)." >&2
  exit 3
fi
if (( CHECK )); then
  echo "sinkhorn kernel: toolchain found ($TPC; glue headers $TPC_INC; op headers $HB_INC)"
  exit 0
fi

step() { echo "+ $*"; "$@" || { echo "sinkhorn kernel: build step failed: $1" >&2; exit 4; }; }
mkdir -p "$OUT"
cd "$OUT"

# 1. The TPC kernel. -ffp-contract=off: every add and multiply rounds on its own (the header's contract).
step "$TPC" -march=gaudi2 -O2 -ffp-contract=off -c "$HERE/sinkhorn_f32.c" -o sinkhorn_f32_gaudi2.o

# 2. Graph-compiler glue with the kernel ELF embedded (symbols _binary_sinkhorn_f32_gaudi2_o_*).
step ld -r -b binary -o sinkhorn_f32_gaudi2_elf.o sinkhorn_f32_gaudi2.o
step "${CXX:-g++}" -std=c++17 -O2 -fPIC -shared -I"$TPC_INC" "$HERE/sinkhorn_glue.cpp" sinkhorn_f32_gaudi2_elf.o -o libcustom_tpc_glm.so

# 3. The PyTorch op, against the image's torch and Habana bridge.
TORCH_FLAGS="$("$PYTHON" - <<'PY'
import sysconfig
import torch.utils.cpp_extension as ce
from habana_frameworks.torch.utils.lib_utils import get_include_dir, get_lib_dir
inc = ce.include_paths() + [get_include_dir(), sysconfig.get_paths()["include"]]
libs = ce.library_paths() + [get_lib_dir()]
abi = int(__import__("torch")._C._GLIBCXX_USE_CXX11_ABI)
print(" ".join([f"-I{p}" for p in inc] + [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs]
               + [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-ltorch", "-ltorch_cpu", "-lc10", "-lhabana_pytorch_plugin"]))
PY
)" || { echo "sinkhorn kernel: cannot read torch/habana build flags" >&2; exit 4; }
# shellcheck disable=SC2086
step "${CXX:-g++}" -std=c++17 -O2 -fPIC -shared -I"$HB_INC" "$HERE/hpu_glm_sinkhorn.cpp" $TORCH_FLAGS -o libhpu_glm_sinkhorn.so

rm -f sinkhorn_f32_gaudi2_elf.o
echo "sinkhorn kernel: built $OUT/libhpu_glm_sinkhorn.so and $OUT/libcustom_tpc_glm.so"
