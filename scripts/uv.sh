# shellcheck shell=bash
# What the set-up scripts share (they source this file): uv, pinned, makes each venv and installs
# into it from one cache, so the four venvs share their wheels (uv links files from its cache
# instead of unpacking a wheel per venv) and a second set-up downloads nothing.
# Sourcing sets UV and FIND_LINKS; `uv_venv DIR` makes a venv (with pip: the ports' install.sh
# and the e2e run scripts call `python -m pip`), `uvpip DIR ARGS...` installs into it.
# Set PYTHON to the base interpreter for the venvs (default python3).
UV_VERSION=0.13.10
PY=${PYTHON:-python3}
UV=.venv/bin/uv
# Where this machine keeps wheels pip finds without an index (the CPU torch 2.13.0 here): pip's own
# find-links setting, which uv does not read; FIXPACK_FIND_LINKS overrides it.
FIND_LINKS=${FIXPACK_FIND_LINKS:-${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}}

# uv lives in .venv (the first venv, made by the standard library's venv so pip can fetch uv).
uv_bootstrap() {
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  if [ ! -x "$UV" ] || [ "$("$UV" --version | awk '{ print $2 }')" != "$UV_VERSION" ]; then
    .venv/bin/python -m pip --disable-pip-version-check -q install "uv==$UV_VERSION"
  fi
}

uv_venv() {
  uv_bootstrap
  [ -x "$1/bin/python" ] || "$UV" venv -q --seed --python "$PY" "$1"
}

# Every install into a venv is constrained by its lock (requirements/locked/<venv>.txt, made by
# scripts/lock-venvs.sh): a fresh set-up gets the versions the last one got, not whatever the index
# holds that day.
uvpip() {
  local venv=$1; shift
  local links=() lock=()
  local dir
  for dir in $FIND_LINKS; do links+=(--find-links "$dir"); done
  local name locked
  name=$(basename "$venv")
  locked="requirements/locked/${name#.}.txt"
  [ -f "$locked" ] && lock=(--constraint "$locked")
  "$UV" pip install -q --python "$venv/bin/python" "${links[@]}" "${lock[@]}" "$@"
}
