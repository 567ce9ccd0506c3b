"""Device gate for mm-merge-idxcopy (runs on one Gaudi card, inside the port image with the
fix applied; to be placed at ports/glm-5-3-flash/tests/hpu/gates/mm-merge-idxcopy.py).

For image layouts like the GLM-5.3-Flash deployment's (up to 4 images, up to 2,048 image
tokens in a prefill chunk of up to 8,192 tokens) it merges the embeddings twice through
vllm-gaudi's _merge_multimodal_embeddings: with the bool mask alone (masked_scatter_, the
stock path) and with the host-built index registered (index_copy_, the fix). Pass: outputs
are bit-identical and the fixed path is not slower (warm median over repeats).
Prints one JSON line.
"""

import json
import statistics
import sys
import time

import habana_frameworks.torch as htorch  # noqa: F401  (registers the hpu device)
import torch

import vllm_gaudi.models.utils as hpu_utils

HIDDEN = 6144
REPEATS = 20


def layout(seed, tokens, images, per_image):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(tokens, dtype=torch.bool)
    starts = sorted(torch.randperm(tokens // per_image - 1, generator=g)[:images].tolist())
    for s in starts:
        mask[s * per_image:(s + 1) * per_image] = True
    return mask


def run(mask_cpu, use_index):
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
    return out.cpu(), statistics.median(times[2:])


def main():
    results, ok = [], True
    for seed, (tokens, images, per_image) in enumerate([(2048, 1, 256), (8192, 4, 512), (8192, 2, 1024)]):
        mask = layout(seed, tokens, images, per_image)
        ref, t_mask = run(mask, use_index=False)
        got, t_index = run(mask, use_index=True)
        same = torch.equal(ref, got)
        ok &= same and t_index <= t_mask * 1.05
        results.append(dict(tokens=tokens, images=images, identical=same, masked_ms=t_mask * 1e3,
                            index_ms=t_index * 1e3))
    print(json.dumps({"gate": "mm-merge-idxcopy", "pass": ok, "cases": results}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
