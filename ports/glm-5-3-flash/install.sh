#!/usr/bin/env bash
# Install the GLM-5.3-Flash port into a stock vllm-gaudi v0.26.0 environment (what the
# port's Dockerfile runs), or into a folder holding vllm/ and vllm_gaudi/ (--root, for tests).
#
#   ports/glm-5-3-flash/install.sh [--root DIR] [--no-plugin]
#
# 1. Checks the base by content: the files the port and the v0.26.0 profile touch must be the
#    pristine release or a state fixpack pins (`apply_all.py --dry-run`, `fixpack verify`).
# 2. With GLM5_NEXT_MHC_SINKHORN=kernel (the default, as served), checks the TPC toolchain
#    before anything is changed.
# 3. Applies the port's source patches with fixpack: selection "--port glm-5-3-flash", i.e. the
#    port's four patches, then the profile's default fixes (the engine pins whole selections;
#    the launch block re-applies the same selection plus its opt-ins at container start: its
#    line need not name the port, which the state record written here keeps).
# 4. Builds the mHC Sinkhorn TPC kernel (kernels/sinkhorn/build.sh). With
#    GLM5_NEXT_MHC_SINKHORN=torch the kernel is not needed and a failed build is only reported:
#    the port then serves its reference Sinkhorn; with =kernel a failed build stops the install.
# 5. Installs the glm5_next_hpu plugin (pip install --no-deps ports/glm-5-3-flash; with --root,
#    into DIR with --target), port.yaml inside it: the switches are read without COOKBOOK.
# 6. Checks all of it again: the selection is applied (hash fast path), `fixpack verify` finds no
#    drift, the plugin's vllm.general_plugins entry point resolves, the kernel loads (on HPU).
#
# Exit codes: 0 installed; 2 usage, or the cookbook/python is incomplete; otherwise the base is
# refused with fixpack's own code (3 base mismatch, 5 drift, ...) and nothing is changed;
# 20 the kernel toolchain is missing with GLM5_NEXT_MHC_SINKHORN=kernel (nothing changed);
# 21 kernel build failed; 22 plugin install failed; 23 the final check failed.
set -euo pipefail

PORT=glm-5-3-flash
PROFILE=v0.26.0
SINKHORN="${GLM5_NEXT_MHC_SINKHORN:-kernel}"
# The steps both ports share (HERE, COOKBOOK, PYTHON; die, say, port_args, port_check_cookbook,
# port_commands, port_check_base, port_pip, port_recheck); the image has the file: its Dockerfile
# copies the repository.
# shellcheck source=SCRIPTDIR/../../scripts/port-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/port-install.sh" \
  || { echo "install.sh: scripts/port-install.sh is missing: not a complete cookbook checkout" >&2; exit 2; }
port_args '2,28p' "$@"
case "$SINKHORN" in kernel|torch) ;; *) die 2 "GLM5_NEXT_MHC_SINKHORN=$SINKHORN: expected kernel or torch" ;; esac

port_check_cookbook
if (( PLUGIN )) && [[ ! -f "$HERE/pyproject.toml" && ! -f "$HERE/setup.py" ]]; then
  die 2 "ports/$PORT has no pyproject.toml: the glm5_next_hpu plugin cannot be installed"
fi

port_commands

# ---- 1. the base, by content
port_check_base

# ---- 2. kernel toolchain, before any change
BUILD="$HERE/kernels/sinkhorn/build.sh"
KERNEL=0
if bash "$BUILD" --check; then
  KERNEL=1
elif [[ "$SINKHORN" == kernel ]]; then
  die 20 "GLM5_NEXT_MHC_SINKHORN=kernel needs the TPC toolchain (above); install inside the Gaudi image, or set GLM5_NEXT_MHC_SINKHORN=torch to serve the reference Sinkhorn. Nothing was changed"
else
  say "no TPC toolchain: skipping the Sinkhorn kernel (GLM5_NEXT_MHC_SINKHORN=torch serves the reference path)"
fi

# ---- 3. the port's patches (and the profile's defaults under them)
say "applying port $PORT on profile $PROFILE"
"${FP[@]}" || die $? "applying the port failed"

# ---- 4. kernel
if (( KERNEL )); then
  say "building the mHC Sinkhorn TPC kernel"
  if ! bash "$BUILD"; then
    [[ "$SINKHORN" == kernel ]] && die 21 "the Sinkhorn kernel did not build (GLM5_NEXT_MHC_SINKHORN=kernel)"
    say "kernel build failed; continuing with GLM5_NEXT_MHC_SINKHORN=torch"
    KERNEL=0
  fi
fi

# ---- 5. plugin
if (( PLUGIN )); then
  say "installing the glm5_next_hpu plugin"
  port_pip glm5_next_hpu
fi

# ---- 6. everything again
port_recheck glm5_next_hpu
if (( KERNEL )); then
  "$PYTHON" - "$HERE/kernels/sinkhorn" <<'PY' || die 23 "the Sinkhorn kernel library does not load"
import sys
sys.path.insert(0, sys.argv[1])
import op
status = op.kernel_status()
print("sinkhorn kernel:", status["why"])
sys.exit(0 if status["kernel"] else 1)
PY
fi
say "port $PORT installed (sinkhorn: $([[ $KERNEL == 1 ]] && echo kernel || echo 'torch only'))"
