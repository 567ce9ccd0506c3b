"""Device gate for the unconfirmed half of seeded-sampling (runs on a Gaudi card only).

Not run by the CPU tests (its verdict is: tests/integration/test_device_gates.py).

The write-up names a segfault of seeded requests on tensor-parallel workers. In the pinned
source a seeded request gets torch.Generator(device="hpu") (HPUModelRunner._update_states),
used only by vLLM's random_sample: q[i].exponential_(generator=g) on an HPU tensor. This gate
runs exactly that on every visible card at once (one process per card, as TP workers do) and
checks that it neither crashes nor differs between cards or from a second run. Exit 0: pass.

    python3 fixes/seeded-sampling/device_gate.py [num_cards]
"""

import os
import sys

import torch
import torch.multiprocessing as mp


def worker(rank, results, steps=32, vocab=151552):
    os.environ.setdefault("PT_HPU_LAZY_MODE", "1")
    import habana_frameworks.torch  # noqa: F401  (registers the hpu device)
    import habana_frameworks.torch.core as htcore
    from vllm.v1.sample.ops.topk_topp_sampler import random_sample

    torch.hpu.set_device(rank)
    gen = torch.Generator(device="hpu")  # as HPUModelRunner._update_states does
    gen.manual_seed(1234)
    probs = torch.softmax(torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)), -1).to("hpu")
    tokens = []
    for _ in range(steps):
        tok = random_sample(probs.clone(), {0: gen})  # row 0 seeded, rows 1-3 shared noise
        htcore.mark_step()
        tokens.append(int(tok[0].cpu()))
    results[rank] = tokens


def verdict(runs: list[list[list[int]]]) -> bool:
    """Every card's seeded stream, in every run, is the first card's first stream."""
    streams = [stream for run in runs for stream in run]
    return bool(streams) and all(s == streams[0] for s in streams)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    runs = []
    for _ in range(2):
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(worker, args=(results, ), nprocs=n, join=True)  # a segfault fails the spawn
            runs.append([results[r] for r in range(n)])
    ok = verdict(runs)
    print("seeded streams identical across cards and runs:", ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
