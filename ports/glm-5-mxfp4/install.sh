#!/usr/bin/env bash
# Install the glm-5-mxfp4 port into a stock vllm-gaudi releases/v0.30.0 environment (what the
# port's Dockerfile runs), or into a folder holding vllm/ and vllm_gaudi/ (--root, for tests).
#
#   ports/glm-5-mxfp4/install.sh [--root DIR] [--no-plugin]
#
# 1. Checks the base by content: the files the port and the v0.30.0 profile touch must be the
#    pristine release or a state fixpack pins (`apply_all.py --dry-run`, `fixpack verify`). A
#    pack whose v0.30.0 lock pins vllm-gaudi only on its development base (main 091bbad, see
#    profiles/v0.30.0.yaml) refuses every image: run `fixpack lock --profile v0.30.0` where the
#    releases/v0.30.0 repository is reachable first.
# 2. Builds the MXFP4 MoE kernels before anything is changed, when the served image needs them:
#    GLM_MXK and GLM_MXK_PREFILL (the port's switches, as the launch block sets them: 1) say
#    whether it does. With either at 1, kernels/mxfp4-moe/build.sh --variant glm builds them
#    (it writes only into its own build/ folder; glm5_hpu/hpu_mxk.py dispatches to the library it
#    makes); where it cannot (no TPC toolchain or Gaudi software: exit 3) the install stops here
#    (exit 20, nothing changed). With both at 0 the image serves vllm-gaudi's stock MXFP4 MoE op
#    and needs no kernel.
# 3. Applies the port's source patches with fixpack: selection "--port glm-5-mxfp4", i.e. the
#    port's patches, then the profile's defaults.
# 5. Installs the port package (glm5_hpu and the converter glm5_mxfp4: pip install --no-deps
#    ports/glm-5-mxfp4; with --root, into DIR with --target). The package must declare the
#    glm5_hpu vllm.general_plugins entry point; without it the install stops before any change
#    (exit 22). --no-plugin skips this step.
# 6. Checks all of it again: the selection is applied (hash fast path), `fixpack verify` finds no
#    drift, the plugin's entry point resolves.
#
# Exit codes: 0 installed; 2 usage, or the cookbook/python is incomplete; otherwise the base is
# refused with fixpack's own code (3 base mismatch, 5 drift, ...) and nothing is changed;
# 20 the kernels are needed (GLM_MXK or GLM_MXK_PREFILL = 1) and could not be built (nothing
# changed); 22 the plugin cannot be installed (nothing changed when found
# before step 3); 23 the final check failed.
set -euo pipefail

PORT=glm-5-mxfp4
PROFILE=v0.30.0
MXK="${GLM_MXK:-1}"
MXK_PREFILL="${GLM_MXK_PREFILL:-1}"
# The steps both ports share (HERE, COOKBOOK, PYTHON; die, say, port_args, port_check_cookbook,
# port_commands, port_check_base, port_pip, port_recheck); the image has the file: its Dockerfile
# copies the repository.
# shellcheck source=SCRIPTDIR/../../scripts/port-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/port-install.sh" \
  || { echo "install.sh: scripts/port-install.sh is missing: not a complete cookbook checkout" >&2; exit 2; }
port_args '2,32p' "$@"
for pair in "GLM_MXK=$MXK" "GLM_MXK_PREFILL=$MXK_PREFILL"; do
  case "${pair#*=}" in 0|1) ;; *) die 2 "$pair: the install takes 1 (kernels, as served) or 0 (reference path)" ;; esac
done

port_check_cookbook
if (( PLUGIN )); then
  [[ -f "$HERE/pyproject.toml" ]] || die 22 "ports/$PORT has no pyproject.toml: the glm5_hpu plugin cannot be installed; nothing was changed"
  grep -q 'vllm.general_plugins' "$HERE/pyproject.toml" \
    || die 22 "ports/$PORT/pyproject.toml declares no vllm.general_plugins entry point for glm5_hpu (it registers the port's model with vLLM); install with --no-plugin for the patches only. Nothing was changed"
fi

port_commands

# ---- 1. the base, by content
port_check_base ", or this pack cannot pin it"

# ---- 2. kernels, before any change
if [[ "$MXK" == 1 || "$MXK_PREFILL" == 1 ]]; then
  say "GLM_MXK=$MXK GLM_MXK_PREFILL=$MXK_PREFILL: building the MXFP4 MoE kernels (kernels/mxfp4-moe/build.sh --variant glm)"
  built=0
  PYTHON="$PYTHON" bash "$HERE/kernels/mxfp4-moe/build.sh" --variant glm || built=$?
  (( built == 0 )) || die 20 "GLM_MXK=$MXK GLM_MXK_PREFILL=$MXK_PREFILL need the MXFP4 MoE kernels, and ports/$PORT/kernels/mxfp4-moe/build.sh could not build them here (exit $built: 3 is no TPC toolchain or Gaudi software); set GLM_MXK=0 GLM_MXK_PREFILL=0 to install vllm-gaudi's stock MXFP4 MoE path. Nothing was changed"
else
  say "GLM_MXK=0 GLM_MXK_PREFILL=0: no kernels (vllm-gaudi's stock MXFP4 MoE op serves)"
fi

# ---- 3. the port's patches (and the profile's defaults under them)
say "applying port $PORT on profile $PROFILE"
"${FP[@]}" || die $? "applying the port failed"

# ---- 5. plugin
if (( PLUGIN )); then
  say "installing the glm5_hpu plugin (with the glm5_mxfp4 converter)"
  port_pip glm5_hpu glm5_mxfp4
fi

# ---- 6. everything again
port_recheck glm5_hpu
say "port $PORT installed (MXFP4 MoE: $([[ "$MXK" == 1 || "$MXK_PREFILL" == 1 ]] && echo 'GLM kernels built' || echo "vllm-gaudi's stock op"); plugin: $([[ $PLUGIN == 1 ]] && echo glm5_hpu || echo 'not installed'))"
