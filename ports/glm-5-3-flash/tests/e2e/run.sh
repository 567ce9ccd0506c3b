#!/usr/bin/env bash
# GLM-5.3-Flash plugin end to end in vLLM 0.26.0 on CPU (vllm-cpu, .venv-cpu).
# Installs the plugin editable into .venv-cpu (idempotent), then runs the plugin tests and the e2e.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT="$(cd "$HERE/../.." && pwd)"
REPO="$(cd "$PORT/../.." && pwd)"
PY="${PYTHON:-$REPO/.venv-cpu/bin/python}"
[[ -x "$PY" ]] || { echo "no interpreter at $PY (set PYTHON=.../.venv-cpu/bin/python)" >&2; exit 2; }
if ! "$PY" - <<'PYX'
import sys
from importlib.metadata import distributions
sys.exit(0 if any(ep.group == "vllm.general_plugins" and ep.value.startswith("glm5_next_hpu")
                  for d in distributions() for ep in d.entry_points) else 1)
PYX
then
  "$PY" -m pip install --no-deps --no-build-isolation -q -e "$PORT"
fi
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
cd "$REPO"
exec "$PY" -m pytest -q -p no:cacheprovider -rs -m "" "$PORT/tests/test_plugin.py" "$PORT/tests/test_tensor_parallel.py" "$PORT/tests/e2e" "$@"
