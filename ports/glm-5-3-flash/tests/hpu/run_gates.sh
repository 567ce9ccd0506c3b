#!/usr/bin/env bash
# Device gates of the GLM-5.3-Flash port, against a server launched as the recipe says
# (`fixpack recipe show`), on a Gaudi card. Not part of the CPU test run.
#
#   ports/glm-5-3-flash/tests/hpu/run_gates.sh [options of python -m gates...]
#
# Environment: GATE_BASE_URL (default http://127.0.0.1:8000), GATE_RESULTS (folder for the
# JSON, default ./gate-results), GATE_WAIT_S (how long to wait for the server, default 3600:
# a cold start reads 328 GB of weights). Examples:
#   run_gates.sh                                  # every gate
#   run_gates.sh --only golden,tools,images       # some of them
#   run_gates.sh --only sinkhorn,fixes            # the kernel and fix checks
# Exit code: the gates package's (0 all pass, 1 a gate failed or errored, 2 bad usage), 3 no server.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
base="${GATE_BASE_URL:-http://127.0.0.1:8000}"
results="${GATE_RESULTS:-./gate-results}"
wait_s="${GATE_WAIT_S:-3600}"
python="${PYTHON:-python3}"

needs_server=1
case " $* " in
  *" --only sinkhorn "*|*" --only fixes "*|*" --only sinkhorn,fixes "*|*" --only fixes,sinkhorn "*) needs_server=0 ;;
esac

if [ "$needs_server" = 1 ]; then
  echo "waiting up to ${wait_s} s for ${base}/v1/models ..." >&2
  deadline=$(( $(date +%s) + wait_s ))
  until curl -sf "${base}/v1/models" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "run_gates.sh: no server at ${base} after ${wait_s} s; launch it as \`fixpack recipe show\` prints" >&2
      exit 3
    fi
    sleep 10
  done
fi

mkdir -p "$results"
out="${results}/gates-$(date -u +%Y%m%dT%H%M%SZ).json"
PYTHONPATH="${here}${PYTHONPATH:+:$PYTHONPATH}" "$python" -m gates --base-url "$base" --json "$out" "$@"
rc=$?
echo "results: $out" >&2
exit $rc
