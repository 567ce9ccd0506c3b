# shellcheck shell=bash
# What both ports' tests/hpu/run_gates.sh share (they source this file): wait for the server the
# recipe launched, then run the port's gates with a results file, and exit with their code.
#
# Environment: GATE_BASE_URL (default http://127.0.0.1:8000), GATE_RESULTS (folder for the JSON,
# default ./gate-results), GATE_WAIT_S (how long to wait for the server, default 3600).
# Exit codes: the gates' own, or 3 when no server answered in time.

base="${GATE_BASE_URL:-http://127.0.0.1:8000}"
results="${GATE_RESULTS:-./gate-results}"
wait_s="${GATE_WAIT_S:-3600}"

# gates_wait_for_server HOW: polls $base/v1/models every 10 s; after GATE_WAIT_S, exit 3 with a
# message that ends "launch it as HOW".
gates_wait_for_server() {
  local how=$1 deadline
  echo "waiting up to ${wait_s} s for ${base}/v1/models ..." >&2
  deadline=$(( $(date +%s) + wait_s ))
  until curl -sf "${base}/v1/models" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "run_gates.sh: no server at ${base} after ${wait_s} s; launch it as ${how}" >&2
      exit 3
    fi
    sleep 10
  done
}

# gates_run COMMAND... -- GATE_ARGS...: runs COMMAND --base-url BASE --json OUT GATE_ARGS..., OUT
# a new timestamped file under GATE_RESULTS; says where it is and exits with COMMAND's code.
gates_run() {
  local cmd=() out rc
  while (( $# )) && [ "$1" != -- ]; do cmd+=("$1"); shift; done
  (( $# )) && shift
  mkdir -p "$results"
  out="${results}/gates-$(date -u +%Y%m%dT%H%M%SZ).json"
  "${cmd[@]}" --base-url "$base" --json "$out" "$@"
  rc=$?
  echo "results: $out" >&2
  exit $rc
}
