#!/usr/bin/env python3
"""Device gate of the MXFP4 MoE TPC kernels: one Gaudi card, no server.

    python ports/glm-5-mxfp4/kernels/mxfp4-moe/gate.py [--lib build/libhpu_glm_mxfp4.so] [--seed 0]

GEMV (GLM_MXK): for GLM-5.3's per-card expert shapes under GLM_MOE_TP=2 (w13: N 2,048, K 6,144;
w2: N 6,144, K 1,024) and two small ones with a partial last chunk (K 96 and 160), at 1, 2, 3,
4, 8 and 16 tokens, random packed bytes with scale codes 112 to 131 (weights of 2^-16 to 6 * 2^4,
no float32 subnormal anywhere) and N(0, 1) bf16 activations: torch.ops.hpu_glm.mxfp4_gemv on the
card against glm5_hpu.mxk.gemv_bf16 on the CPU, the kernels' order of operations. Pass: bit
for bit, every shape and token count.

Unpack (GLM_MXK_PREFILL): every byte value under every scale code, and a w13-sized random
expert: torch.ops.hpu_glm.mxfp4_unpack on the card against glm5_hpu.mxk.unpack_bf16 and against
the reference dequantization (glm5_hpu.moe_mxfp4.dequantize to bf16). Pass: the same bits
(NaN where the scale code is 255, in all three).

Printed per case: how many outputs differ and the largest difference in bf16 units in the last
place. Exit codes: 0 pass; 1 a difference; 2 cannot run here (no Gaudi software, no card, or the
ops did not load). Run by ports/glm-5-mxfp4/tests/hpu/run_gates.sh (gate "mxk"); it cannot run
on the repository's CPU machines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import op  # this script's folder is first on sys.path
import torch

from glm5_hpu import moe_mxfp4, mxk

GEMV_SHAPES = [(2048, 6144), (6144, 1024), (64, 96), (128, 160)]  # (N, K)
TOKENS = [1, 2, 3, 4, 8, 16]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16).to(torch.int32)


def compare(name: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same bits, NaN where NaN; prints the count of differing outputs and the largest ulp gap."""
    g_nan, w_nan = torch.isnan(got), torch.isnan(want)
    differ = (bits(got) != bits(want)) & ~(g_nan & w_nan)
    n = int(differ.sum())
    ulps = int((bits(got) - bits(want)).abs()[differ].max()) if n else 0
    print(f"{name}: {'identical' if not n else f'{n} of {got.numel()} outputs differ (largest gap {ulps} ulp)'}")
    return n == 0


def weights(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(112, 132, (n, k // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    return packed, scales


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", type=Path, help="the op library (default: build/libhpu_glm_mxfp4.so here)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    # the library first: it sets GC_KERNEL_PATH before the device is acquired
    loaded = op.load(a.lib)
    try:
        import habana_frameworks.torch.core as htcore
    except ImportError as exc:
        print(f"mxk gate: cannot run: no Gaudi software ({exc})")
        return 2
    if not torch.hpu.is_available():
        print("mxk gate: cannot run: no Gaudi card")
        return 2
    if not loaded:
        print(f"mxk gate: cannot run: {op.kernel_status()['why']}")
        return 2
    g = torch.Generator().manual_seed(a.seed)
    ok = True
    for n, k in GEMV_SHAPES:
        packed, scales = weights(n, k, g)
        dp, ds = packed.to("hpu"), scales.to("hpu")
        for t in TOKENS:
            x = torch.randn(t, k, generator=g).to(torch.bfloat16)
            got = torch.ops.hpu_glm.mxfp4_gemv(x.to("hpu"), dp, ds)
            htcore.mark_step()
            ok &= compare(f"gemv N {n} K {k} T {t:2d}", got.cpu(), mxk.gemv_bf16(x, packed, scales))

    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    cases = {
        "unpack every byte x every scale code": (every.repeat(256, 16), every[:, None].repeat(1, 256)),
        "unpack w13-sized expert": weights(2048, 6144, g),
    }
    for name, (packed, scales) in cases.items():
        got = torch.ops.hpu_glm.mxfp4_unpack(packed.to("hpu"), scales.to("hpu"))
        htcore.mark_step()
        got = got.cpu()
        ok &= compare(f"{name} (vs the emulation)", got, mxk.unpack_bf16(packed, scales))
        ok &= compare(
            f"{name} (vs the reference dequantization)", got, moe_mxfp4.dequantize(packed, scales, torch.bfloat16)
        )
    print("mxk gate:", "pass" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
