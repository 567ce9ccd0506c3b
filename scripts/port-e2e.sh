# shellcheck shell=bash
# What both ports' tests/e2e/run.sh share (they source this file): the port's vLLM-CPU
# interpreter, the port installed editable into it when its plugin entry point is missing
# (idempotent), and vLLM's engine core in the test process with a 1 GiB KV cache (a variable
# already set wins). Sourcing sets PORT (the port folder, two above the sourcing run.sh) and REPO;
# the caller then runs pytest with "$PY".

PORT="$(cd "$(dirname "${BASH_SOURCE[1]}")/../.." && pwd)"
REPO="$(cd "$PORT/../.." && pwd)"

# e2e_prepare VENV PACKAGE: PY is PYTHON, else REPO/VENV/bin/python (exit 2 when it is not
# there); PACKAGE is the port's plugin package (the vllm.general_plugins entry point's module).
e2e_prepare() {
  local venv=$1 package=$2
  PY="${PYTHON:-$REPO/$venv/bin/python}"
  [[ -x "$PY" ]] || { echo "no interpreter at $PY (set PYTHON=.../$venv/bin/python)" >&2; exit 2; }
  if ! "$PY" - "$package" <<'PYX'
import sys
from importlib.metadata import distributions
sys.exit(0 if any(ep.group == "vllm.general_plugins" and ep.value.startswith(sys.argv[1])
                  for d in distributions() for ep in d.entry_points) else 1)
PYX
  then
    "$PY" -m pip install --no-deps --no-build-isolation -q -e "$PORT"
  fi
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
  export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
  cd "$REPO" || exit 2
}
