#!/usr/bin/env bash
# Device gates of the glm-5-mxfp4 port, against a server launched as the recipe says
# (`fixpack recipe show --recipe recipes/zai-org/GLM-5.3-BF16/recipe.yaml`), on Gaudi cards.
# Not part of the CPU test run.
#
#   ports/glm-5-mxfp4/tests/hpu/run_gates.sh [options of glm53_gates.py...]
#   ports/glm-5-mxfp4/tests/hpu/run_gates.sh --only mxk   # the MXFP4 MoE kernels on one free card, no server
#
# Environment: GATE_BASE_URL (default http://127.0.0.1:8000), GATE_RESULTS (folder for the JSON,
# default ./gate-results), GATE_WAIT_S (how long to wait for the server, default 3600: the
# checkpoint load took 25 minutes on the page's node).
# Exit code: glm53_gates.py's (0 all pass, 1 a gate failed, errored or was not run, 2 bad usage), 3 no server.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
base="${GATE_BASE_URL:-http://127.0.0.1:8000}"
results="${GATE_RESULTS:-./gate-results}"
wait_s="${GATE_WAIT_S:-3600}"
python="${PYTHON:-python3}"

needs_server=1
case " $* " in *" --only mxk "*|*" --only=mxk "*) needs_server=0 ;; esac

if [ "$needs_server" -eq 1 ]; then
  echo "waiting up to ${wait_s} s for ${base}/v1/models ..." >&2
  deadline=$(( $(date +%s) + wait_s ))
  until curl -sf "${base}/v1/models" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "run_gates.sh: no server at ${base} after ${wait_s} s; launch it as the recipe prints" >&2
      exit 3
    fi
    sleep 10
  done
fi

mkdir -p "$results"
out="${results}/gates-$(date -u +%Y%m%dT%H%M%SZ).json"
"$python" "$here/glm53_gates.py" --base-url "$base" --json "$out" "$@"
rc=$?
echo "results: $out" >&2
exit $rc
