#!/usr/bin/env bash
# The main job on a machine with no Gaudi image: build a scratch tree of the pinned v0.26.0
# release sources, apply the profile there (image build), re-run it (container start),
# verify, and revert. DEST defaults to a fresh temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-$(mktemp -d /tmp/fixpack-v0.26.0-XXXXXX)}
FP=.venv/bin/fixpack
$FP sources tree "$DEST" --profile v0.26.0
echo "== image build: python apply_all.py --profile v0.26.0 --root $DEST"
.venv/bin/python apply_all.py --profile v0.26.0 --root "$DEST"
# the profile's opt-ins, one argument each
mapfile -t OPT_INS < <($FP list --profile v0.26.0 --json | .venv/bin/python -c 'import json,sys; [print(f["id"]) for f in json.load(sys.stdin)[0]["fixes"] if f["role"]=="opt-in"]')
echo "== container start, with the opt-in: python apply_all.py --profile v0.26.0 glm47-streaming-text-markers --root $DEST"
.venv/bin/python apply_all.py --profile v0.26.0 "${OPT_INS[@]}" --root "$DEST"
echo "== container start again (already applied: hashing only)"
.venv/bin/python apply_all.py --profile v0.26.0 "${OPT_INS[@]}" --root "$DEST"
echo "== fixpack verify"
$FP verify --root "$DEST"
echo "scratch tree with the profile applied: $DEST"

# Profile v0.30.0: the vLLM half is the exact release; the vllm-gaudi half is pinned on its
# development base wherever releases/v0.30.0 cannot be fetched. An image is refused (exit 3)
# until the release pins exist; a scratch tree of the development base takes the fixes when
# told it is one.
DEST30=${2:-$(mktemp -d /tmp/fixpack-v0.30.0-XXXXXX)}
$FP sources tree "$DEST30" --profile v0.30.0
bases=$(.venv/bin/python -c 'import json; print(json.load(open("profiles/v0.30.0.lock.json"))["bases"]["vllm_gaudi"]["base"])')
echo "== v0.30.0: vllm-gaudi pins come from its $bases base"
if [ "$bases" = development ]; then
  echo "== image build as on a stock image: python apply_all.py --profile v0.30.0 --root $DEST30 (refused)"
  set +e
  .venv/bin/python apply_all.py --profile v0.30.0 --root "$DEST30"
  rc=$?
  set -e
  [ "$rc" -eq 3 ] || { echo "expected exit 3 (base mismatch), got $rc"; exit 1; }
  echo "== the same on the development base tree: --development-base"
  .venv/bin/python apply_all.py --profile v0.30.0 --root "$DEST30" --development-base
else
  .venv/bin/python apply_all.py --profile v0.30.0 --root "$DEST30"
fi
$FP verify --profile v0.30.0 --root "$DEST30"
echo "scratch tree with the v0.30.0 profile applied: $DEST30"
