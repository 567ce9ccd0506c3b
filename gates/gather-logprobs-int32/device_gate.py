"""Device gate for gather-logprobs-int32 (no fix ships; this decides whether one is needed).

On HPU, sampled top-logprobs come from vllm_gaudi.patches._hpu_gather_logprobs (it replaces
vLLM's Sampler.gather_logprobs) and prompt top-logprobs from
HPUModelRunner._gather_prompt_logprobs_hpu. Both concatenate int64 token ids with the topk
indices and cast the result to int32 on the device. This gate runs both on the card, eager
and through torch.compile (the HPU backend, as the sampler runs), over logprobs with no ties
(so the topk order is defined) at GLM's vocabulary size, and compares every id, rank and value
with vLLM's own gather_logprobs on the CPU.

Pass (exit 0): every id and rank equal, values within 1e-6: the int64 -> int32 path is sound on
this card and no fix is needed. Fail (exit 1): the first differing rows are printed; that is
the evidence a fix would need. Prints one JSON line last.

    python3 gates/gather-logprobs-int32/device_gate.py [--device hpu] [--no-compile]

With ``--device cpu`` the same comparison runs on the CPU (both sides equal by construction);
the suite uses it to check this script's own logic without a card.
"""

from __future__ import annotations

import argparse
import json
import sys

VOCAB = 151552  # GLM-5.3-Flash's padded lm_head
CASES = [(1, 1), (1, 20), (7, 5), (64, 20), (256, 8)]  # (rows, num_logprobs)


def tie_free_logprobs(rows: int, vocab: int, seed: int):
    """Log-softmax of logits that are a random permutation of distinct values per row: no two
    entries of a row are equal, so topk has one right answer on every device."""
    import torch

    g = torch.Generator().manual_seed(seed)
    base = torch.arange(vocab, dtype=torch.float32) * (16.0 / vocab)  # distinct, spaced above fp32 rounding
    logits = torch.stack([base[torch.randperm(vocab, generator=g)] for _ in range(rows)])
    token_ids = torch.randint(0, vocab, (rows,), generator=g, dtype=torch.int64)
    # The largest id and a few near it must round-trip through int32.
    token_ids[0] = vocab - 1
    return torch.log_softmax(logits, dim=-1), token_ids


def reference_path():
    """vLLM's own gather_logprobs, taken before vllm_gaudi's patches replace it."""
    from vllm.v1.sample.sampler import Sampler

    return Sampler.__dict__["gather_logprobs"].__func__


def reference(fn, logprobs, k: int, token_ids):
    """(ids int32, logprobs, ranks) of ``fn`` on the CPU."""
    out = fn(logprobs.cpu(), k, token_ids.cpu())
    return out.logprob_token_ids, out.logprobs, out.selected_token_ranks


def compare(label: str, ref: tuple, got: tuple, tol: float = 1e-6) -> list[str]:
    """The differences between two (ids, logprobs, ranks) triples, as readable lines."""
    import torch

    problems = []
    ids_r, lp_r, rk_r = ref
    ids_g, lp_g, rk_g = (t.cpu() for t in got)
    if ids_g.dtype != torch.int32:
        problems.append(f"{label}: ids are {ids_g.dtype}, not int32")
    if ids_g.shape != ids_r.shape:
        return problems + [f"{label}: ids shape {tuple(ids_g.shape)}, expected {tuple(ids_r.shape)}"]
    bad = (ids_g.to(torch.int64) != ids_r.to(torch.int64)).nonzero().tolist()
    for row, col in bad[:3]:
        problems.append(f"{label}: row {row} id {col}: {int(ids_g[row, col])}, expected {int(ids_r[row, col])}")
    if len(bad) > 3:
        problems.append(f"{label}: {len(bad)} ids differ in all")
    if not torch.equal(rk_g.to(torch.int64), rk_r.to(torch.int64)):
        row = int((rk_g.to(torch.int64) != rk_r.to(torch.int64)).nonzero()[0])
        problems.append(f"{label}: row {row} rank {int(rk_g[row])}, expected {int(rk_r[row])}")
    err = float((lp_g.float() - lp_r.float()).abs().max()) if lp_g.shape == lp_r.shape else float("inf")
    if err > tol:
        problems.append(f"{label}: logprobs differ by up to {err:.3g}")
    return problems


def paths_in_effect():
    """The two HPU functions in effect: vllm_gaudi's plugin hook installs the same two patches
    (batched_count_greater_than, then gather_logprobs) when vLLM loads its plugins."""
    import vllm.v1.sample.sampler as sampler
    import vllm_gaudi.patches as patches
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

    patches._patch_batched_count_greater_than()
    patches._patch_gather_logprobs()

    def prompt_path(logprobs, k, token_ids):
        return HPUModelRunner._gather_prompt_logprobs_hpu(None, logprobs, k, token_ids)

    return {"sampled (Sampler.gather_logprobs as patched)": sampler.Sampler.gather_logprobs, "prompt (_gather_prompt_logprobs_hpu)": prompt_path}


def run(device: str, compiled: bool) -> dict:
    import torch

    ref_fn = reference_path()
    paths = paths_in_effect()
    problems: list[str] = []
    checked = 0
    for seed, (rows, k) in enumerate(CASES):
        logprobs, token_ids = tie_free_logprobs(rows, VOCAB, seed)
        ref = reference(ref_fn, logprobs, k, token_ids)
        for name, fn in paths.items():
            modes = [("eager", fn)]
            if compiled:
                modes.append(("compiled", torch.compile(fn, backend="hpu_backend" if device == "hpu" else "inductor", dynamic=False)))
            for mode, f in modes:
                out = f(logprobs.to(device), k, token_ids.to(device))
                if device == "hpu":
                    torch.hpu.synchronize()
                got = (out.logprob_token_ids, out.logprobs, out.selected_token_ranks)
                problems += compare(f"{name} {mode} rows={rows} k={k}", ref, got)
                checked += 1
    return {"gate": "gather-logprobs-int32", "pass": not problems, "device": device, "runs": checked, "problems": problems[:20]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="hpu")
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    a = ap.parse_args(argv)
    if a.device == "hpu":
        import habana_frameworks.torch  # noqa: F401  (registers the hpu device)
    res = run(a.device, not a.no_compile)
    for p in res["problems"]:
        print(p)
    print(json.dumps(res))
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
