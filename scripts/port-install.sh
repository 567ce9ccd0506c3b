# shellcheck shell=bash
# The steps every port's install.sh shares (ports/<name>/install.sh sources this file): the
# arguments, the cookbook check, the base check by content, the plugin install from a copy, and
# the final checks. Each port keeps its own kernel steps, its own plugin precondition and its
# own messages around these.
#
# The caller sets PORT and PROFILE before sourcing; sourcing sets HERE (the port folder, where
# the sourcing install.sh is), COOKBOOK (default: the checkout HERE is in) and PYTHON (default
# python3). The functions set ROOT and PLUGIN (port_args), FP and VERIFY (port_commands), SRC
# (port_pip). Exit codes are the install's: 2 usage or an incomplete cookbook/python; fixpack's
# own code when the base is refused; 22 the plugin install failed; 23 a final check failed.

: "${PORT:?}" "${PROFILE:?}"
HERE="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
COOKBOOK="${COOKBOOK:-$(cd "$HERE/../.." && pwd)}"
PYTHON="${PYTHON:-python3}"

die() { local code=$1; shift; echo "install.sh: $*" >&2; exit "$code"; }
say() { echo "== $*"; }

# port_args HELP_LINES ARGS...: --root DIR, --no-plugin, --help (prints the sed range
# HELP_LINES of the calling script, e.g. 2,28p).
port_args() {
  local help=$1
  shift
  ROOT=""
  PLUGIN=1
  while (( $# )); do
    case "$1" in
      --root) [[ $# -ge 2 ]] || die 2 "--root needs a folder"; ROOT="$(cd "$2" && pwd)" || die 2 "--root $2: no such folder"; shift 2 ;;
      --no-plugin) PLUGIN=0; shift ;;
      -h|--help) sed -n "$help" "$0"; exit 0 ;;
      *) die 2 "unknown argument $1 (see --help)" ;;
    esac
  done
}

# The cookbook holds the engine and this port, and the interpreter has fixpack's dependencies.
port_check_cookbook() {
  [[ -f "$COOKBOOK/apply_all.py" && -f "$COOKBOOK/ports/$PORT/port.yaml" ]] \
    || die 2 "$COOKBOOK is not a complete cookbook checkout (apply_all.py, ports/$PORT/port.yaml)"
  "$PYTHON" -c "import yaml, libcst, unidiff" 2>/dev/null \
    || die 2 "$PYTHON lacks fixpack's dependencies (pyyaml, libcst, unidiff); run: $PYTHON -m pip install $COOKBOOK"
}

# FP: the port's selection through apply_all.py; VERIFY: fixpack verify; both on ROOT when set.
port_commands() {
  FP=("$PYTHON" "$COOKBOOK/apply_all.py" --profile "$PROFILE" --port "$PORT" --pack "$COOKBOOK")
  VERIFY=("$PYTHON" -m fixpack verify --profile "$PROFILE" --pack "$COOKBOOK")
  if [[ -n "$ROOT" ]]; then
    FP+=(--root "$ROOT")
    VERIFY+=(--root "$ROOT")
  fi
  export PYTHONPATH="$COOKBOOK${PYTHONPATH:+:$PYTHONPATH}"  # fixpack from the cookbook, never another copy
}

# Step 1, the base by content: pristine (pending) or already at the port's pins, and no drift.
# NOTE (optional) is added to the refusal's first clause.
port_check_base() {
  local note=${1:-} rc
  say "checking the base (vllm-gaudi and vLLM files against the $PROFILE release)"
  set +e
  "${FP[@]}" --dry-run
  rc=$?
  set -e
  case $rc in
    0) say "the port selection is already applied" ;;
    1) : ;;  # pending: the pristine release, as expected
    *) die "$rc" "the base is not the stock vllm-gaudi $PROFILE release$note (fixpack exit $rc); nothing was changed" ;;
  esac
  set +e
  "${VERIFY[@]}"
  rc=$?
  set -e
  (( rc == 0 )) || die "$rc" "fixpack verify found drift in the base (exit $rc); nothing was changed"
}

# port_pip PACKAGE...: pip-installs the port folder's packages (with its packaging files) into
# the environment, or into ROOT with --target.
port_pip() {
  local f
  # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources it builds.
  SRC="$(mktemp -d)"
  trap 'rm -rf "$SRC"' EXIT
  for f in "$@"; do cp -r "$HERE/$f" "$SRC/"; done
  # port.yaml (the switch declarations the plugin parses) travels inside the first package, so an
  # installed plugin reads it without the checkout or $COOKBOOK (its pyproject lists it as data).
  [[ -f "$HERE/port.yaml" && -d "$SRC/$1" ]] && cp "$HERE/port.yaml" "$SRC/$1/port.yaml"
  for f in pyproject.toml setup.py setup.cfg README.md; do [[ -f "$HERE/$f" ]] && cp "$HERE/$f" "$SRC/"; done
  find "$SRC" -name __pycache__ -prune -exec rm -rf {} +
  local pip=("$PYTHON" -m pip install --no-deps --disable-pip-version-check -q)
  if [[ -n "$ROOT" ]]; then
    "${pip[@]}" --no-build-isolation --upgrade --target "$ROOT" "$SRC" || die 22 "pip install of the plugin failed"
  else
    "${pip[@]}" "$SRC" || die 22 "pip install of the plugin failed"
  fi
}

# port_recheck PACKAGE: the selection at its pins (hash fast path), no drift, and (with the
# plugin) a vllm.general_plugins entry point of PACKAGE.
port_recheck() {
  local package=$1
  say "checking the installation"
  "${FP[@]}" || die 23 "the port selection is not at its pins after applying"
  "${VERIFY[@]}" || die 23 "fixpack verify found drift after applying"
  (( PLUGIN )) || return 0
  ROOT="$ROOT" PACKAGE="$package" "$PYTHON" - <<'PY' || die 23 "the $package plugin is not registered"
import os, sys
from importlib.metadata import distributions
root, package = os.environ.get("ROOT"), os.environ["PACKAGE"]
dists = distributions(path=[root]) if root else distributions()
eps = [ep for d in dists for ep in d.entry_points if ep.group == "vllm.general_plugins" and ep.value.split(":")[0].split(".")[0] == package]
if not eps:
    sys.exit(f"no vllm.general_plugins entry point for {package}")
print(f"plugin entry point: {eps[0].name} = {eps[0].value}")
PY
}
