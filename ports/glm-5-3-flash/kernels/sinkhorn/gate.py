#!/usr/bin/env python3
"""Device gate of the mHC Sinkhorn TPC kernel: one Gaudi card, no server.

    python ports/glm-5-3-flash/kernels/sinkhorn/gate.py [--rows 1 2 3 63 64 65 1024]

For each row count R, random 4 x 4 combs (softmax of scaled normals + eps, as mHC makes them)
go through (a) vLLM 0.26.0's stock Sinkhorn loop on the card, the expression of
vllm/model_executor/kernels/mhc/torch.py mhc_pre_torch (one column step, then iters-1 row and
column steps, `x / (x.sum(dim) + eps)`), and (b) torch.ops.hpu_glm.mhc_sinkhorn. Pass: (b) is
bit-identical to (a) for every R. Also printed, not gated: how many elements of (b) differ
from the CPU emulation (op.sinkhorn_tpc_order), which tells whether the card's reciprocal
rounds like the host's.

Exit codes: 0 pass; 1 a mismatch; 2 cannot run here (no card, or the kernel did not load).
Run by ports/glm-5-3-flash/tests/hpu/run_gates.sh (gate "sinkhorn"). It cannot run on the
repository's CPU machines.
"""

from __future__ import annotations

import argparse
import sys

import op  # this script's own folder is first on sys.path
import torch

EPS = 1e-6
ITERS = 20


def stock_loop(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    # vLLM 0.26.0 mhc_pre_torch, the Sinkhorn lines, unchanged in form.
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 2, 3, 63, 64, 65, 128, 1000, 1024])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    try:
        import habana_frameworks.torch.core as htcore
    except ImportError as exc:
        print(f"sinkhorn gate: cannot run: no Gaudi software ({exc})")
        return 2
    if not torch.hpu.is_available():
        print("sinkhorn gate: cannot run: no Gaudi card")
        return 2
    if not op.load():
        print(f"sinkhorn gate: cannot run: {op.kernel_status()['why']}")
        return 2
    g = torch.Generator().manual_seed(a.seed)
    failed = 0
    for rows in a.rows:
        comb = torch.softmax(torch.randn(rows, 4, 4, generator=g) * 4, dim=-1) + EPS
        dev = comb.to("hpu")
        ref = stock_loop(dev, ITERS, EPS)
        got = torch.ops.hpu_glm.mhc_sinkhorn(dev, EPS, ITERS)
        htcore.mark_step()
        ref, got = ref.cpu(), got.cpu()
        same = torch.equal(ref, got)
        emu = op.sinkhorn_tpc_order(comb, ITERS, EPS)
        n_emu = int((emu != got).sum())
        n_ref = int((ref != got).sum())
        print(
            f"rows {rows:5d}: kernel vs stock loop on card {'identical' if same else f'{n_ref} elements differ (max {float((ref - got).abs().max()):.3g})'}; "
            f"kernel vs CPU emulation {n_emu} elements differ"
        )
        failed += not same
    print("sinkhorn gate:", "pass" if not failed else f"FAIL ({failed} row counts differ)")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
