"""Device gate for mm-merge-idxcopy (one Gaudi card, in the image with the fix applied).

For image layouts like the GLM-5.3-Flash deployment's (up to 4 images, up to 2,048 image
tokens in a prefill chunk of up to 8,192 tokens) it merges the embeddings twice through
vllm-gaudi's _merge_multimodal_embeddings: with the bool mask alone (masked_scatter_, the
stock path) and with the host-built index registered (index_copy_, the fix). Each layout is a
new image-token count, so its first call includes any compile that count triggers.

Pass (the fix is needed): outputs bit-identical, the index path at least 5 % faster warm
(the claimed defect: masked_scatter_'s dynamic nonzero costs device time) and its first call
(compile included) not more than 5 % slower. A card where the stock path is as fast fails
the gate: there the fix has no reason to ship. Prints one JSON line.
"""

import json
import statistics
import sys
import time

HIDDEN = 6144
REPEATS = 20
WARM_GAIN = 0.95  # index path warm median at most this fraction of the stock path's
COLD_SLACK = 1.05  # first call (compile included) at most this much slower


def verdict(cases: list[dict]) -> tuple[bool, list[str]]:
    """Whether the measured cases justify the fix, and why not."""
    why = []
    if not cases:
        return False, ["no case measured"]
    for c in cases:
        tag = f"{c['tokens']} tokens / {c['images']} images"
        if not c["identical"]:
            why.append(f"{tag}: outputs differ")
        if c["index_ms"] > c["masked_ms"] * WARM_GAIN:
            why.append(f"{tag}: index path {c['index_ms']:.3f} ms warm vs stock {c['masked_ms']:.3f} ms: not {100 * (1 - WARM_GAIN):.0f} % faster")
        if c["index_cold_ms"] > c["masked_cold_ms"] * COLD_SLACK:
            why.append(f"{tag}: first call {c['index_cold_ms']:.1f} ms vs stock {c['masked_cold_ms']:.1f} ms (compile cost)")
    return not why, why

HIDDEN = 6144
REPEATS = 20


def layout(seed, tokens, images, per_image):
    import torch

    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(tokens, dtype=torch.bool)
    starts = sorted(torch.randperm(tokens // per_image - 1, generator=g)[:images].tolist())
    for s in starts:
        mask[s * per_image:(s + 1) * per_image] = True
    return mask


def run(mask_cpu, use_index):
    import torch
    import vllm_gaudi.models.utils as hpu_utils

    dev = "hpu"
    n = int(mask_cpu.sum())
    embeds = [torch.randn(n, HIDDEN, dtype=torch.bfloat16, device=dev)]
    base = torch.randn(mask_cpu.numel(), HIDDEN, dtype=torch.bfloat16, device=dev)
    times, out = [], None
    for _ in range(REPEATS):
        inputs = base.clone()
        mask = mask_cpu.to(dev)
        if use_index:  # as HPUModelRunner._gather_mm_embeddings attaches it
            mask.hpu_mm_index = torch.nonzero(mask_cpu, as_tuple=True)[0].to(dev)
        torch.hpu.synchronize()
        t0 = time.perf_counter()
        out = hpu_utils._merge_multimodal_embeddings(inputs, embeds, mask)
        torch.hpu.synchronize()
        times.append(time.perf_counter() - t0)
    return out.cpu(), statistics.median(times[2:]), times[0]


def main():
    import habana_frameworks.torch  # noqa: F401  (registers the hpu device)
    import torch

    results = []
    for seed, (tokens, images, per_image) in enumerate([(2048, 1, 256), (8192, 4, 512), (8192, 2, 1024)]):
        mask = layout(seed, tokens, images, per_image)
        ref, t_mask, cold_mask = run(mask, use_index=False)
        got, t_index, cold_index = run(mask, use_index=True)
        results.append(dict(tokens=tokens, images=images, identical=torch.equal(ref, got), masked_ms=t_mask * 1e3,
                            index_ms=t_index * 1e3, masked_cold_ms=cold_mask * 1e3, index_cold_ms=cold_index * 1e3))
    ok, why = verdict(results)
    print(json.dumps({"gate": "mm-merge-idxcopy", "pass": ok, "why_not": why, "cases": results}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
