"""Device gate for moe-explicit-overload (one Gaudi card, lazy mode, port image with the fix
applied; to be placed at ports/glm-5-3-flash/tests/hpu/gates/moe-explicit-overload.py).

1. Which overload does the packet pick? Calls torch.ops.hpu.mixture_of_experts with the
   dynamic-scale keyword set of VllmMixtureOfExpertsOpFP8PerChannel and checks the output is
   bit-identical to .fp8_fused_weights_dynamic (and the static set to .fp8_fused_weights).
2. Does the packet read back to the host? Counts aten::item / _local_scalar_dense in a
   torch.profiler trace of one one-token packet call (expected >= 1 before the fix's change,
   0 through the named overload).
3. Time: host time per MoE layer for 1 token, 36 local experts (GLM-5.3-Flash with expert
   parallel on 8 cards), packet vs named overload, 48 layers chained without a mark_step.
Pass: 1 identical, 2 named = 0 reads, 3 named not slower. Prints one JSON line.
"""

import json
import sys
import time

import habana_frameworks.torch as htorch
import torch
from torch.profiler import profile

from vllm_gaudi.extension.ops import dynamic_quant

H, INTER, E, K, LAYERS = 6144, 1024, 36, 8, 48
dev = "hpu"


def weights():
    w12 = [torch.randn(2 * INTER, H, device=dev).to(torch.float8_e4m3fn) for _ in range(E)]
    w3 = [torch.randn(H, INTER, device=dev).to(torch.float8_e4m3fn) for _ in range(E)]
    s12 = [torch.rand(2 * INTER, device=dev) * 0.01 for _ in range(E)]
    s3 = [torch.rand(H, device=dev) * 0.01 for _ in range(E)]
    return w12, w3, s12, s3


def call(fn, x, ids, wts, w):
    x_fp8, x_scale = dynamic_quant(x)
    return fn(hidden_states=x_fp8, expert_routing_table=ids, router_weights=wts, w12=w[0], w3=w[1],
              d_scale_hidden_states=x_scale, d_scale_w12=w[2], d_scale_w3=w[3], permuted_weights=True,
              activation="silu", experts_min=0, experts_max=E - 1)


def main():
    packet = torch.ops.hpu.mixture_of_experts
    named = torch.ops.hpu.mixture_of_experts.fp8_fused_weights_dynamic
    w = weights()
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, E, (1, K), device=dev, dtype=torch.int64)
    wts = torch.rand(1, K, device=dev, dtype=torch.bfloat16)

    identical = torch.equal(call(packet, x, ids, wts, w).cpu(), call(named, x, ids, wts, w).cpu())

    reads = {}
    for label, fn in (("packet", packet), ("named", named)):
        htorch.core.mark_step()
        with profile() as prof:
            call(fn, x, ids, wts, w)
            htorch.core.mark_step()
        reads[label] = sum(e.name in ("aten::item", "aten::_local_scalar_dense") for e in prof.events())

    times = {}
    for label, fn in (("packet", packet), ("named", named)):
        for _ in range(3):
            y = x
            for _ in range(LAYERS):
                y = call(fn, y, ids, wts, w)
            htorch.core.mark_step()
            torch.hpu.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            y = x
            for _ in range(LAYERS):
                y = call(fn, y, ids, wts, w)
            htorch.core.mark_step()
        torch.hpu.synchronize()
        times[label] = (time.perf_counter() - t0) / 10 / LAYERS * 1e3

    ok = identical and reads["named"] == 0 and times["named"] <= times["packet"] * 1.02
    print(json.dumps({"gate": "moe-explicit-overload", "pass": ok, "identical": identical, "host_reads": reads,
                      "ms_per_layer": times}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
