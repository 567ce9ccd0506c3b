#!/usr/bin/env bash
# .venv-tf514: the stock vllm-gaudi v0.26.0 image's transformers (5.14.1, which has no glm5_next)
# beside the CPU torch and vLLM 0.26.0's Python requirements, for the port's config-registration
# test (ports/glm-5-3-flash/tests/test_hf_config_tf514.py). vLLM itself is imported from the
# release tree (`fixpack sources tree`), as the fix tests do. About 1 GB; run after setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-tf514/bin/python ] || "$PY" -m venv .venv-tf514
pip() { .venv-tf514/bin/python -m pip --disable-pip-version-check -q "$@"; }
# torch first and pinned: 2.13.0 is the CPU build; any other version pulls a multi-GB CUDA build.
pip install torch==2.13.0
# vLLM 0.26.0's requirements with transformers held at the image's version.
pip install -r requirements/vllm-0.26.0-cpu.txt transformers==5.14.1 pytest pyyaml
# The plugin, editable: its vllm.general_plugins entry point is what vLLM loads.
pip install --no-deps -e ports/glm-5-3-flash
.venv-tf514/bin/python -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
