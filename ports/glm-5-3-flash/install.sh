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
#    the launch block re-applies the same selection plus its opt-ins at container start, which
#    must therefore also pass --port glm-5-3-flash, or the engine would unwind the port).
# 4. Builds the mHC Sinkhorn TPC kernel (kernels/sinkhorn/build.sh). With
#    GLM5_NEXT_MHC_SINKHORN=torch the kernel is not needed and a failed build is only reported:
#    the port then serves its reference Sinkhorn; with =kernel a failed build stops the install.
# 5. Installs the glm5_next_hpu plugin (pip install --no-deps ports/glm-5-3-flash; with --root,
#    into DIR with --target).
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
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COOKBOOK="${COOKBOOK:-$(cd "$HERE/../.." && pwd)}"
PYTHON="${PYTHON:-python3}"
SINKHORN="${GLM5_NEXT_MHC_SINKHORN:-kernel}"
ROOT=""
PLUGIN=1

die() { local code=$1; shift; echo "install.sh: $*" >&2; exit "$code"; }
say() { echo "== $*"; }

while (( $# )); do
  case "$1" in
    --root) [[ $# -ge 2 ]] || die 2 "--root needs a folder"; ROOT="$(cd "$2" && pwd)" || die 2 "--root $2: no such folder"; shift 2 ;;
    --no-plugin) PLUGIN=0; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) die 2 "unknown argument $1 (see --help)" ;;
  esac
done
case "$SINKHORN" in kernel|torch) ;; *) die 2 "GLM5_NEXT_MHC_SINKHORN=$SINKHORN: expected kernel or torch" ;; esac

[[ -f "$COOKBOOK/apply_all.py" && -f "$COOKBOOK/ports/$PORT/port.yaml" ]] \
  || die 2 "$COOKBOOK is not a complete cookbook checkout (apply_all.py, ports/$PORT/port.yaml)"
"$PYTHON" -c "import yaml, libcst, unidiff" 2>/dev/null \
  || die 2 "$PYTHON lacks fixpack's dependencies (pyyaml, libcst, unidiff); run: $PYTHON -m pip install $COOKBOOK"
if (( PLUGIN )) && [[ ! -f "$HERE/pyproject.toml" && ! -f "$HERE/setup.py" ]]; then
  die 2 "ports/$PORT has no pyproject.toml: the glm5_next_hpu plugin cannot be installed"
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
  *) die "$rc" "the base is not the stock vllm-gaudi $PROFILE release (fixpack exit $rc); nothing was changed" ;;
esac
set +e
"${VERIFY[@]}"
rc=$?
set -e
(( rc == 0 )) || die "$rc" "fixpack verify found drift in the base (exit $rc); nothing was changed"

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
  # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources it builds.
  SRC="$(mktemp -d)"
  trap 'rm -rf "$SRC"' EXIT
  cp -r "$HERE/glm5_next_hpu" "$SRC/"
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
  ROOT="$ROOT" "$PYTHON" - <<'PY' || die 23 "the glm5_next_hpu plugin is not registered"
import os, sys
from importlib.metadata import distributions
root = os.environ.get("ROOT")
dists = distributions(path=[root]) if root else distributions()
eps = [ep for d in dists for ep in d.entry_points if ep.group == "vllm.general_plugins" and ep.value.split(":")[0].split(".")[0] == "glm5_next_hpu"]
if not eps:
    sys.exit("no vllm.general_plugins entry point for glm5_next_hpu")
print(f"plugin entry point: {eps[0].name} = {eps[0].value}")
PY
fi
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
