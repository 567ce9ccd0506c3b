#!/usr/bin/env bash
# Writes requirements/locked/<venv>.txt from what each venv holds now: run it after a set-up that
# changed a requirement (scripts/setup*.sh), then commit the locks. The editable installs (fixpack,
# the ports) are left out: they come from the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=SCRIPTDIR/uv.sh
source scripts/uv.sh
for venv in .venv .venv-cpu .venv-cpu030 .venv-tf514; do
  [ -x "$venv/bin/python" ] || { echo "lock-venvs: $venv is missing; run scripts/setup.sh first" >&2; exit 1; }
  out="requirements/locked/${venv#.}.txt"
  {
    echo "# What $venv resolved to in a fresh set-up (scripts/setup*.sh), used as constraints by scripts/uv.sh's uvpip so"
    echo "# every set-up, CI's included, installs the same versions (and fixpack check's proof keys, which"
    echo "# name the venv's distributions, stay valid). Remake: scripts/lock-venvs.sh after a set-up."
    "$UV" pip freeze --python "$venv/bin/python" | grep -v -e '^-e ' -e '@ file:' -e '^#'
  } > "$out"
  echo "lock-venvs: $out ($(grep -vc '^#' "$out") distributions)"
done
