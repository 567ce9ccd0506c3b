"""Device gate for moe-explicit-overload (one Gaudi card, lazy mode, image with the fix applied).

1. Which overload does the packet pick? Calls torch.ops.hpu.mixture_of_experts with the
   dynamic-scale keyword set of VllmMixtureOfExpertsOpFP8PerChannel and checks the output is
   bit-identical to .fp8_fused_weights_dynamic (and the static set to .fp8_fused_weights).
2. Does the packet read back to the host? Counts aten::item / _local_scalar_dense in a
   torch.profiler trace of one one-token packet call (expected >= 1 before the fix's change,
   0 through the named overload).
3. Time: host time per MoE layer for 1 token, 36 local experts (GLM-5.3-Flash with expert
   parallel on 8 cards), packet vs named overload, 48 layers chained without a mark_step.
Pass (the fix is needed): 1 identical, 2 the packet reads back at least once (the defect the
fix claims) and the named overload never, 3 named not slower. A card where the packet does
not read back fails the gate: there the fix has no reason to ship. Also prints the overloads
and schemas the plugin registers (the fix's overload names were inferred, not read).
Prints one JSON line.
"""

import json
import sys
import time

H, INTER, E, K, LAYERS = 6144, 1024, 36, 8, 48
dev = "hpu"
SLACK = 1.02


def verdict(identical: bool, reads: dict, ms_per_layer: dict) -> tuple[bool, list[str]]:
    """Whether the measurements justify the fix, and why not."""
    why = []
    if not identical:
        why.append("packet and named overload outputs differ")
    if reads.get("packet", 0) < 1:
        why.append("the packet call reads nothing back: the defect does not show on this card")
    if reads.get("named", 0) != 0:
        why.append(f"the named overload reads back {reads['named']} time(s)")
    if ms_per_layer["named"] > ms_per_layer["packet"] * SLACK:
        why.append(f"named {ms_per_layer['named']:.3f} ms/layer vs packet {ms_per_layer['packet']:.3f}: slower")
    return not why, why


def weights():
    import torch

    w12 = [torch.randn(2 * INTER, H, device=dev).to(torch.float8_e4m3fn) for _ in range(E)]
    w3 = [torch.randn(H, INTER, device=dev).to(torch.float8_e4m3fn) for _ in range(E)]
    s12 = [torch.rand(2 * INTER, device=dev) * 0.01 for _ in range(E)]
    s3 = [torch.rand(H, device=dev) * 0.01 for _ in range(E)]
    return w12, w3, s12, s3


def call(fn, x, ids, wts, w):
    from vllm_gaudi.extension.ops import dynamic_quant

    x_fp8, x_scale = dynamic_quant(x)
    return fn(hidden_states=x_fp8, expert_routing_table=ids, router_weights=wts, w12=w[0], w3=w[1],
              d_scale_hidden_states=x_scale, d_scale_w12=w[2], d_scale_w3=w[3], permuted_weights=True,
              activation="silu", experts_min=0, experts_max=E - 1)


def main():
    import habana_frameworks.torch as htorch
    import torch
    from torch.profiler import profile

    packet = torch.ops.hpu.mixture_of_experts
    overloads = {n: str(getattr(packet, n)._schema) for n in packet.overloads()}
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

    ok, why = verdict(identical, reads, times)
    print(json.dumps({"gate": "moe-explicit-overload", "pass": ok, "why_not": why, "identical": identical, "host_reads": reads,
                      "ms_per_layer": times, "overloads": overloads}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
