#!/usr/bin/env bash
# Device gates of the glm-5-mxfp4 port, against a server launched as the recipe says
# (`fixpack recipe show --recipe recipes/zai-org/GLM-5.3-BF16/recipe.yaml`), on Gaudi cards.
# Not part of the CPU test run. The gates (port.yaml `gates`: glm53_gates.py here) run under
# fixpack's one gate runner: python3 -m fixpack.gates --port glm-5-mxfp4 (fixpack/gates/runner.py).
#
#   ports/glm-5-mxfp4/tests/hpu/run_gates.sh [gate options...]
#   ports/glm-5-mxfp4/tests/hpu/run_gates.sh --only mxk   # the MXFP4 MoE kernels on one free card, no server
#
# Environment: GATE_BASE_URL (default http://127.0.0.1:8000), GATE_RESULTS (folder for the JSON,
# default ./gate-results), GATE_WAIT_S (how long to wait for the server, default 3600: the
# checkpoint load took 25 minutes on the page's node).
# Exit code: the runner's (0 all pass, 1 a gate failed, errored or was not run, 2 bad usage), 3 no server.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/../../../../scripts/gates.sh
source "$here/../../../../scripts/gates.sh" || exit 2
python="${PYTHON:-python3}"

# the kernels' gate (--only mxk) runs on a free card without a server
case " $* " in *" --only mxk "*|*" --only=mxk "*) ;; *) gates_wait_for_server "the recipe prints" ;; esac
cookbook="$(cd "$here/../../../.." && pwd)"
gates_run env COOKBOOK="${COOKBOOK:-$cookbook}" PYTHONPATH="${COOKBOOK:-$cookbook}${PYTHONPATH:+:$PYTHONPATH}" \
  "$python" -m fixpack.gates --port glm-5-mxfp4 -- "$@"
