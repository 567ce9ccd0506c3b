#!/usr/bin/env bash
# .venv-tf514: the stock vllm-gaudi v0.26.0 image's transformers (5.14.1, which has no glm5_next)
# beside the CPU torch and vLLM 0.26.0's Python requirements, for the port's config-registration
# test (ports/glm-5-3-flash/tests/test_hf_config_tf514.py). vLLM itself is imported from the
# release tree (`fixpack sources tree`), as the fix tests do. About 1 GB; run after setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=SCRIPTDIR/uv.sh
source scripts/uv.sh
uv_venv .venv-tf514
# torch first and pinned: 2.13.0+cpu is the CPU build; any other version pulls a multi-GB CUDA build.
uvpip .venv-tf514 torch==2.13.0+cpu
# vLLM 0.26.0's requirements with transformers held at the image's version.
uvpip .venv-tf514 -r requirements/vllm-0.26.0-cpu.txt transformers==5.14.1 pytest pyyaml
# The plugin, editable: its vllm.general_plugins entry point is what vLLM loads.
uvpip .venv-tf514 --no-deps -e ports/glm-5-3-flash
.venv-tf514/bin/python -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
