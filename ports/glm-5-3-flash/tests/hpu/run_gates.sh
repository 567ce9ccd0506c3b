#!/usr/bin/env bash
# Device gates of the GLM-5.3-Flash port, against a server launched as the recipe says
# (`fixpack recipe show`), on a Gaudi card. Not part of the CPU test run.
#
#   ports/glm-5-3-flash/tests/hpu/run_gates.sh [gate options...]
#
# The gates (port.yaml `gates`: the package gates/ here) run under fixpack's one gate runner:
# python3 -m fixpack.gates --port glm-5-3-flash (fixpack/gates/runner.py).
#
# Environment: GATE_BASE_URL (default http://127.0.0.1:8000), GATE_RESULTS (folder for the
# JSON, default ./gate-results), GATE_WAIT_S (how long to wait for the server, default 3600:
# a cold start reads 328 GB of weights). Examples:
#   run_gates.sh                                  # every gate
#   run_gates.sh --only golden,tools,images       # some of them
#   run_gates.sh --only sinkhorn,fixes            # the kernel and fix checks
# Exit code: the runner's (0 all pass, 1 a gate failed or errored, 2 bad usage), 3 no server.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/../../../../scripts/gates.sh
source "$here/../../../../scripts/gates.sh" || exit 2
python="${PYTHON:-python3}"

needs_server=1
case " $* " in
  *" --only sinkhorn "*|*" --only fixes "*|*" --only sinkhorn,fixes "*|*" --only fixes,sinkhorn "*) needs_server=0 ;;
esac

if [ "$needs_server" = 1 ]; then
  gates_wait_for_server "\`fixpack recipe show\` prints"
fi
cookbook="$(cd "$here/../../../.." && pwd)"
# fixpack from this checkout unless the image installed it (it has, at $COOKBOOK)
gates_run env COOKBOOK="${COOKBOOK:-$cookbook}" PYTHONPATH="${COOKBOOK:-$cookbook}${PYTHONPATH:+:$PYTHONPATH}" \
  "$python" -m fixpack.gates --port glm-5-3-flash -- "$@"
