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
# 2. Checks the MXFP4 MoE kernels before anything is changed. GLM_MXK and GLM_MXK_PREFILL (the
#    port's switches, as the launch block sets them: 1) say whether the served image needs them.
#    The kernels' sources and build script are written (kernels/mxfp4-moe/, build.sh --variant
#    glm) but nothing in glm5_hpu dispatches to them yet, so with either switch at 1 the install
#    stops here (exit 20, nothing changed) rather than build kernels nothing would call; with both
#    at 0 the image serves the reference MXFP4 path (glm5_hpu/moe_mxfp4.py) and needs no kernel.
# 3. Applies the port's source patches with fixpack: selection "--port glm-5-mxfp4", i.e. the
#    port's patches, then the profile's defaults.
# 4. (The kernel build, `build.sh --variant glm`, belongs here once the dispatch exists.)
# 5. Installs the port package (glm5_hpu and the converter glm5_mxfp4: pip install --no-deps
#    ports/glm-5-mxfp4; with --root, into DIR with --target). The package must declare the
#    glm5_hpu vllm.general_plugins entry point; without it the install stops before any change
#    (exit 22): there is no vLLM model to register yet. --no-plugin skips this step.
# 6. Checks all of it again: the selection is applied (hash fast path), `fixpack verify` finds no
#    drift, the plugin's entry point resolves.
#
# Exit codes: 0 installed; 2 usage, or the cookbook/python is incomplete; otherwise the base is
# refused with fixpack's own code (3 base mismatch, 5 drift, ...) and nothing is changed;
# 20 the kernels are needed (GLM_MXK or GLM_MXK_PREFILL = 1) and not dispatched yet (nothing
# changed); 22 the plugin cannot be installed (nothing changed when found
# before step 3); 23 the final check failed.
set -euo pipefail

PORT=glm-5-mxfp4
PROFILE=v0.30.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COOKBOOK="${COOKBOOK:-$(cd "$HERE/../.." && pwd)}"
PYTHON="${PYTHON:-python3}"
MXK="${GLM_MXK:-1}"
MXK_PREFILL="${GLM_MXK_PREFILL:-1}"
ROOT=""
PLUGIN=1

die() { local code=$1; shift; echo "install.sh: $*" >&2; exit "$code"; }
say() { echo "== $*"; }

while (( $# )); do
  case "$1" in
    --root) [[ $# -ge 2 ]] || die 2 "--root needs a folder"; ROOT="$(cd "$2" && pwd)" || die 2 "--root $2: no such folder"; shift 2 ;;
    --no-plugin) PLUGIN=0; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) die 2 "unknown argument $1 (see --help)" ;;
  esac
done
for pair in "GLM_MXK=$MXK" "GLM_MXK_PREFILL=$MXK_PREFILL"; do
  case "${pair#*=}" in 0|1) ;; *) die 2 "$pair: the install takes 1 (kernels, as served) or 0 (reference path)" ;; esac
done

[[ -f "$COOKBOOK/apply_all.py" && -f "$COOKBOOK/ports/$PORT/port.yaml" ]] \
  || die 2 "$COOKBOOK is not a complete cookbook checkout (apply_all.py, ports/$PORT/port.yaml)"
"$PYTHON" -c "import yaml, libcst, unidiff" 2>/dev/null \
  || die 2 "$PYTHON lacks fixpack's dependencies (pyyaml, libcst, unidiff); run: $PYTHON -m pip install $COOKBOOK"
if (( PLUGIN )); then
  [[ -f "$HERE/pyproject.toml" ]] || die 22 "ports/$PORT has no pyproject.toml: the glm5_hpu plugin cannot be installed; nothing was changed"
  grep -q 'vllm.general_plugins' "$HERE/pyproject.toml" \
    || die 22 "ports/$PORT/pyproject.toml declares no vllm.general_plugins entry point for glm5_hpu (the port has no vLLM model to register yet); install with --no-plugin for the patches only. Nothing was changed"
fi

FP=("$PYTHON" "$COOKBOOK/apply_all.py" --profile "$PROFILE" --port "$PORT" --pack "$COOKBOOK")
VERIFY=("$PYTHON" -m fixpack verify --profile "$PROFILE" --pack "$COOKBOOK")
if [[ -n "$ROOT" ]]; then
  FP+=(--root "$ROOT")
  VERIFY+=(--root "$ROOT")
fi
export PYTHONPATH="$COOKBOOK${PYTHONPATH:+:$PYTHONPATH}"  # fixpack from the cookbook, never another copy

# ---- 1. the base, by content
say "checking the base (vllm-gaudi and vLLM files against the $PROFILE release)"
set +e
"${FP[@]}" --dry-run
rc=$?
set -e
case $rc in
  0) say "the port selection is already applied" ;;
  1) : ;;  # pending: the pristine release, as expected
  *) die "$rc" "the base is not the stock vllm-gaudi $PROFILE release, or this pack cannot pin it (fixpack exit $rc); nothing was changed" ;;
esac
set +e
"${VERIFY[@]}"
rc=$?
set -e
(( rc == 0 )) || die "$rc" "fixpack verify found drift in the base (exit $rc); nothing was changed"

# ---- 2. kernels, before any change
if [[ "$MXK" == 1 || "$MXK_PREFILL" == 1 ]]; then
  die 20 "GLM_MXK=$MXK GLM_MXK_PREFILL=$MXK_PREFILL need the MXFP4 MoE kernels and their dispatch: the kernels' sources and build script are in ports/$PORT/kernels/mxfp4-moe/ (not yet built or run on a card), but nothing in glm5_hpu calls them yet; set GLM_MXK=0 GLM_MXK_PREFILL=0 to install the reference path. Nothing was changed"
fi
say "GLM_MXK=0 GLM_MXK_PREFILL=0: no kernels (the reference MXFP4 path serves)"

# ---- 3. the port's patches (and the profile's defaults under them)
say "applying port $PORT on profile $PROFILE"
"${FP[@]}" || die $? "applying the port failed"

# ---- 5. plugin
if (( PLUGIN )); then
  say "installing the glm5_hpu plugin (with the glm5_mxfp4 converter)"
  # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources it builds.
  SRC="$(mktemp -d)"
  trap 'rm -rf "$SRC"' EXIT
  cp -r "$HERE/glm5_hpu" "$HERE/glm5_mxfp4" "$SRC/"
  for f in pyproject.toml setup.py setup.cfg README.md; do [[ -f "$HERE/$f" ]] && cp "$HERE/$f" "$SRC/"; done
  find "$SRC" -name __pycache__ -prune -exec rm -rf {} +
  PIP=("$PYTHON" -m pip install --no-deps --disable-pip-version-check -q)
  if [[ -n "$ROOT" ]]; then
    "${PIP[@]}" --no-build-isolation --upgrade --target "$ROOT" "$SRC" || die 22 "pip install of the plugin failed"
  else
    "${PIP[@]}" "$SRC" || die 22 "pip install of the plugin failed"
  fi
fi

# ---- 6. everything again
say "checking the installation"
"${FP[@]}" || die 23 "the port selection is not at its pins after applying"
"${VERIFY[@]}" || die 23 "fixpack verify found drift after applying"
if (( PLUGIN )); then
  ROOT="$ROOT" "$PYTHON" - <<'PY' || die 23 "the glm5_hpu plugin is not registered"
import os, sys
from importlib.metadata import distributions
root = os.environ.get("ROOT")
dists = distributions(path=[root]) if root else distributions()
eps = [ep for d in dists for ep in d.entry_points if ep.group == "vllm.general_plugins" and ep.value.split(":")[0].split(".")[0] == "glm5_hpu"]
if not eps:
    sys.exit("no vllm.general_plugins entry point for glm5_hpu")
print(f"plugin entry point: {eps[0].name} = {eps[0].value}")
PY
fi
say "port $PORT installed (MXFP4 MoE: reference path; plugin: $([[ $PLUGIN == 1 ]] && echo glm5_hpu || echo 'not installed'))"
