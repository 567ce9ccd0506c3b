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
echo "== container start, with the opt-in: python apply_all.py --profile v0.26.0 glm47-streaming-text-markers --root $DEST"
.venv/bin/python apply_all.py --profile v0.26.0 $($FP list --profile v0.26.0 --json | .venv/bin/python -c 'import json,sys; print(" ".join(f["id"] for f in json.load(sys.stdin)[0]["fixes"] if f["role"]=="opt-in"))') --root "$DEST"
echo "== container start again (already applied: hashing only)"
.venv/bin/python apply_all.py --profile v0.26.0 $($FP list --profile v0.26.0 --json | .venv/bin/python -c 'import json,sys; print(" ".join(f["id"] for f in json.load(sys.stdin)[0]["fixes"] if f["role"]=="opt-in"))') --root "$DEST"
echo "== fixpack verify"
$FP verify --root "$DEST"
echo "scratch tree with the profile applied: $DEST"
