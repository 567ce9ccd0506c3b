#!/usr/bin/env bash
# Build the MXFP4 MoE TPC kernels (GLM_MXK, GLM_MXK_PREFILL) and their PyTorch ops on a Gaudi
# software image.
#
#   ports/glm-5-mxfp4/kernels/mxfp4-moe/build.sh [--variant glm] [--check]
#
# --variant glm (the default, and the only variant): GLM-5.3's expert shapes need nothing
# compiled in; the name is the serving page's. --check only looks for the toolchain.
#
# Produces, in build/ beside this script:
#   mxfp4_gemv_bf16_gaudi2.o, mxfp4_unpack_bf16_gaudi2.o   the TPC kernels (tpc-clang -march=gaudi2)
#   libcustom_tpc_glm_mxfp4.so   graph-compiler glue with both kernels embedded (GC_KERNEL_PATH)
#   libhpu_glm_mxfp4.so          the PyTorch ops hpu_glm::mxfp4_gemv, hpu_glm::mxfp4_unpack (op.py)
#
# Exit codes: 0 built (--check: toolchain present); 2 usage; 3 toolchain or Gaudi software
# missing (nothing built); 4 a build step failed.
#
# Environment: TPC_CLANG (default: tpc-clang on PATH, then the Habana TPC SDK locations),
# TPC_INCLUDE (folder holding tpc_kernel_lib_interface.h), HABANA_INCLUDE (folder holding
# hpu_custom_op_pt2.h; default /usr/include/habanalabs), PYTHON (default python3), CXX (g++).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/build"
PYTHON="${PYTHON:-python3}"
CXX="${CXX:-g++}"
CHECK=0
VARIANT=glm

usage() { echo "usage: build.sh [--variant glm] [--check]" >&2; exit 2; }
while (( $# )); do
  case "$1" in
    --check) CHECK=1; shift ;;
    --variant) [[ $# -ge 2 ]] || usage; VARIANT="$2"; shift 2 ;;
    --variant=*) VARIANT="${1#*=}"; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; usage ;;
  esac
done
[[ "$VARIANT" == glm ]] || { echo "build.sh: --variant $VARIANT: the only variant is glm" >&2; exit 2; }

missing=()
tpc=""
if [[ -n "${TPC_CLANG:-}" ]]; then
  [[ -x "$TPC_CLANG" ]] && tpc="$TPC_CLANG"
else
  tpc="$(command -v tpc-clang 2>/dev/null || true)"
  for c in /usr/bin/tpc-clang /opt/habanalabs/tpc_llvm/bin/tpc-clang /usr/lib/habanalabs/tpc_llvm/bin/tpc-clang; do
    [[ -z "$tpc" && -x "$c" ]] && tpc="$c"
  done
fi
[[ -n "$tpc" ]] || missing+=("tpc-clang, the Habana TPC-C compiler (set TPC_CLANG=/path/to/tpc-clang)")

header_dir() {  # $1 header, then candidate folders; prints the first folder holding it
  local h="$1" d
  shift
  for d in "$@"; do
    if [[ -n "$d" && -f "$d/$h" ]]; then echo "$d"; return 0; fi
  done
  return 0
}
tpc_inc="$(header_dir tpc_kernel_lib_interface.h "${TPC_INCLUDE:-}" /usr/include/habanalabs /usr/lib/habanalabs/include /opt/habanalabs/include)"
[[ -n "$tpc_inc" ]] || missing+=("tpc_kernel_lib_interface.h, the TPC SDK glue header (set TPC_INCLUDE)")
hb_inc="$(header_dir hpu_custom_op_pt2.h "${HABANA_INCLUDE:-}" /usr/include/habanalabs)"
[[ -n "$hb_inc" ]] || missing+=("hpu_custom_op_pt2.h, the Habana PyTorch custom-op header (set HABANA_INCLUDE)")
"$PYTHON" -c "import habana_frameworks.torch.utils.lib_utils" >/dev/null 2>&1 \
  || missing+=("habana_frameworks (the Gaudi PyTorch bridge) in $PYTHON")
command -v "$CXX" >/dev/null 2>&1 || missing+=("a C++ compiler ($CXX)")

if (( ${#missing[@]} )); then
  echo "mxfp4-moe kernels: cannot build here; missing:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  echo "Build inside the Gaudi software image (vllm-gaudi releases/v0.30.0), or serve with" >&2
  echo "GLM_MXK=0 GLM_MXK_PREFILL=0 (the reference MXFP4 path, glm5_hpu/moe_mxfp4.py, needs no kernel)." >&2
  exit 3
fi
if (( CHECK )); then
  echo "mxfp4-moe kernels: toolchain found ($tpc; glue header in $tpc_inc; op header in $hb_inc)"
  exit 0
fi

step() { echo "+ $*"; "$@" || { echo "mxfp4-moe kernels: build step failed: $1" >&2; exit 4; }; }
mkdir -p "$OUT"
cd "$OUT"

# 1. The TPC kernels. -ffp-contract=off: every multiply and add is its own instruction (the
#    kernels' order contracts).
for k in mxfp4_gemv_bf16 mxfp4_unpack_bf16; do
  step "$tpc" -march=gaudi2 -O2 -ffp-contract=off -I"$HERE" -c "$HERE/$k.c" -o "${k}_gaudi2.o"
done

# 2. The graph-compiler glue with both kernel ELFs embedded (symbols _binary_<name>_gaudi2_o_*).
step ld -r -b binary -o kernels_elf.o mxfp4_gemv_bf16_gaudi2.o mxfp4_unpack_bf16_gaudi2.o
step "$CXX" -std=c++17 -O2 -fPIC -shared -I"$tpc_inc" "$HERE/mxfp4_glue.cpp" kernels_elf.o -o libcustom_tpc_glm_mxfp4.so

# 3. The PyTorch ops, against the image's torch and Habana bridge.
torch_flags="$("$PYTHON" - <<'PY'
import sysconfig

import torch
import torch.utils.cpp_extension as ce
from habana_frameworks.torch.utils.lib_utils import get_include_dir, get_lib_dir

inc = [*ce.include_paths(), get_include_dir(), sysconfig.get_paths()["include"]]
libs = [*ce.library_paths(), get_lib_dir()]
abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
flags = [f"-I{p}" for p in inc] + [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs]
flags += [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-ltorch", "-ltorch_cpu", "-lc10", "-lhabana_pytorch_plugin"]
print(" ".join(flags))
PY
)" || { echo "mxfp4-moe kernels: cannot read the torch / Habana build flags from $PYTHON" >&2; exit 4; }
read -r -a flags <<<"$torch_flags"
step "$CXX" -std=c++17 -O2 -fPIC -shared -I"$hb_inc" "$HERE/hpu_glm_mxfp4.cpp" "${flags[@]}" -o libhpu_glm_mxfp4.so

rm -f kernels_elf.o
echo "mxfp4-moe kernels: built $OUT/libhpu_glm_mxfp4.so and $OUT/libcustom_tpc_glm_mxfp4.so"
