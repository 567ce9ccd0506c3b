"""Decode gaps while long prompts prefill, with and without VLLM_LONG_PREFILL_SHARE.

    .venv/bin/python bench/bench_long_prefill_share.py [--share 0.25] [--budget 8192]
        [--threshold 4096] [--step-ms 30] [--token-ms 0.2]

Builds a scratch tree of profile v0.30.0 (vLLM 0.30.0 from the release wheel), applies the
profile with the opt-in vllm-long-prefill-share through apply_all.py, and drives that tree's
real vLLM Scheduler step by step: four decodes run while a 64K- and a 100K-token prompt
prefill (--max-num-batched-tokens --budget, --long-prefill-token-threshold --threshold).
"without" is the same patched scheduler with VLLM_LONG_PREFILL_SHARE unset, which schedules
exactly as the release (the fix's test test_unset_schedules_exactly_as_the_release).
A second shape has two of the four decodes arrive once the long prompts have started.

What is counted, exactly: for every decode token, the tokens the steps since its previous
token scheduled (the work between two tokens of a stream), and the number of steps. What is
modelled (no accelerator here): a step's time as --step-ms + --token-ms x its scheduled
tokens; the seconds printed are that model's, not a measurement. The ratios are same-run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # fixpack imports as installed (`pip install -e .`)
PROFILE = "v0.30.0"
LONG = {"long64k": 65536, "long100k": 102400}
BLOCK = 16
MAX_MODEL_LEN = 110_000


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# ---------------------------------------------------------------- child: the scheduler runs


def make_scheduler(model_dir: Path, budget: int, threshold: int):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    num_blocks = (sum(LONG.values()) + 16 * 8192) // BLOCK
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN, dtype="bfloat16")
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=MAX_MODEL_LEN,
        long_prefill_token_threshold=threshold, enable_chunked_prefill=True, is_encoder_decoder=False,
    )
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False))
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["model.layers.0.self_attn.attn"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=16, dtype=torch.bfloat16))])
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv, block_size=BLOCK,
                     structured_output_manager=StructuredOutputManager(vllm_config), log_stats=False)


def request(req_id: str, prompt_len: int, max_tokens: int):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(req_id, [(i * 7 + 3) % 256 for i in range(prompt_len)], SamplingParams(max_tokens=max_tokens, ignore_eos=True), None)


def run_shape(scheduler, late: int, step_ms: float, token_ms: float) -> dict:
    """Decodes dec0..dec3 (the last `late` of them arrive at step 3), both long prompts at
    step 1. Runs until both long prompts have finished."""
    from vllm.v1.outputs import ModelRunnerOutput

    arrivals = {0: [request(f"dec{i}", 32 + 8 * i, 100_000) for i in range(4 - late)],
                1: [request(rid, n, 2) for rid, n in LONG.items()],
                3: [request(f"dec{i}", 32 + 8 * i, 100_000) for i in range(4 - late, 4)]}
    since = {}  # decode -> (tokens, steps, ms) of the steps since its previous token
    gaps_tokens, gaps_steps, gaps_ms = [], [], []
    first_token_step = {}
    finished, step, clock = set(), 0, 0.0
    long_done_ms = {}
    while not set(LONG) <= finished:
        for req in arrivals.get(step, ()):
            scheduler.add_request(req)
            if req.request_id.startswith("dec"):
                since[req.request_id] = None  # waiting for its first token
        out = scheduler.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        tokens = sum(scheduled.values())
        ms = step_ms + token_ms * tokens if scheduled else 0.0
        clock += ms
        req_ids = list(scheduled)
        sampled = []
        for rid in req_ids:
            r = scheduler.requests[rid]
            got = r.num_computed_tokens >= r.num_tokens
            sampled.append([11] if got else [])
        for rid in since:
            if since[rid] is not None:
                t, s, m = since[rid]
                since[rid] = (t + tokens, s + 1, m + ms)
        for rid, got in zip(req_ids, sampled, strict=False):
            if not got or not rid.startswith("dec"):
                continue
            if since[rid] is None:
                first_token_step[rid] = step
            else:
                t, s, m = since[rid]
                gaps_tokens.append(t)
                gaps_steps.append(s)
                gaps_ms.append(m)
            since[rid] = (0, 0, 0.0)
        outputs = scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)}, sampled_token_ids=sampled))
        for o in (o for eo in outputs.values() for o in eo.outputs):
            if o.finished:
                finished.add(o.request_id)
                long_done_ms.setdefault(o.request_id, clock)
        step += 1
    return {"steps": step, "gaps_tokens": gaps_tokens, "gaps_steps": gaps_steps, "gaps_ms": gaps_ms,
            "first_token_step": first_token_step, "long_done_ms": long_done_ms}


def child(args) -> None:
    from fixpack.proofs.release_tree import tree_from_env, use_tree

    use_tree(tree_from_env())
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ["HF_HUB_OFFLINE"] = "1"
    model_dir = Path(tempfile.mkdtemp(prefix="bench-lps-"))
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 256,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}))
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.model_executor.models.registry import ModelRegistry

    ModelRegistry.register_model("LlamaForCausalLM", LlamaForCausalLM)  # inspected in this process
    import vllm.v1.core.sched.scheduler as sched_mod

    assert hasattr(sched_mod, "_long_prefill_share_from_env"), "the tree's scheduler is not the patched one"
    results = {}
    for late in (0, 2):
        for label, share in (("without", None), ("with", str(args.share))):
            os.environ.pop("VLLM_LONG_PREFILL_SHARE", None)
            if share is not None:
                os.environ["VLLM_LONG_PREFILL_SHARE"] = share
            scheduler = make_scheduler(model_dir, args.budget, args.threshold)
            assert (scheduler.long_prefill_share is not None) == (share is not None)
            results[f"{late}:{label}"] = run_shape(scheduler, late, args.step_ms, args.token_ms)
    print("RESULTS " + json.dumps(results))


# ---------------------------------------------------------------- parent: tree, apply, table


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--budget", type=int, default=8192, help="--max-num-batched-tokens")
    ap.add_argument("--threshold", type=int, default=4096, help="--long-prefill-token-threshold")
    ap.add_argument("--step-ms", type=float, default=30.0, help="modelled fixed time of a step")
    ap.add_argument("--token-ms", type=float, default=0.2, help="modelled time per scheduled token")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    from fixpack.pack.pack import Pack
    from fixpack.sources import sources

    profile = Pack(REPO).profile(PROFILE)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tree = sources.materialise(profile.base["sources"], Path(tmp) / "tree")
        # vllm-gaudi's half of this profile is pinned on its development base only.
        r = subprocess.run([py, str(REPO / "apply_all.py"), "--profile", PROFILE, "--root", str(tree), "--development-base",
                            "vllm-long-prefill-share"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"apply_all.py failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        env = dict(os.environ, FIXPACK_TREE=str(tree), PYTHONDONTWRITEBYTECODE="1")
        for name in ("VLLM_LONG_PREFILL_SHARE", "VLLM_LONG_PREFILL_MIN_TOKENS", "VLLM_LONG_PREFILL_SHARE_ASYNC"):
            env.pop(name, None)
        c = subprocess.run([py, __file__, "--child", *sys.argv[1:]], capture_output=True, text=True, env=env)
        line = next((ln for ln in c.stdout.splitlines() if ln.startswith("RESULTS ")), None)
        if c.returncode != 0 or line is None:
            sys.exit(f"the scheduler run failed ({c.returncode}):\n{c.stdout[-3000:]}\n{c.stderr[-3000:]}")
        results = json.loads(line[len("RESULTS "):])

    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); vLLM 0.30.0 Scheduler with vllm-long-prefill-share applied")
    print(f"budget {args.budget} tokens/step, long-prefill threshold {args.threshold}, share {args.share} "
          f"(cap {max(1, int(args.share * args.budget))} tokens/step), prompts {LONG['long64k']} + {LONG['long100k']} tokens")
    print(f"modelled step time: {args.step_ms} ms + {args.token_ms} ms x scheduled tokens (not measured)\n")
    for late, title in ((0, "four decodes running, then both long prompts"),
                        (2, "two decodes running, both long prompts, two more decodes arriving 2 steps later")):
        print(f"== {title}")
        print(f"{'':9}{'steps':>6}  {'gap tokens p50/p90/max':>24}  {'gap ms p50':>10} {'p90':>7} {'p99':>7} {'max':>7}"
              f"  {'long done (ms) 64K/100K':>24}  first token step of late decodes")
        for label in ("without", "with"):
            r = results[f"{late}:{label}"]
            gt, gm = r["gaps_tokens"], r["gaps_ms"]
            late_first = {k: v for k, v in r["first_token_step"].items() if int(k[3:]) >= 4 - late}
            print(f"{label:9}{r['steps']:>6}  {pct(gt, .5):>8.0f}/{pct(gt, .9):>6.0f}/{max(gt):>7.0f}  "
                  f"{pct(gm, .5):>10.1f} {pct(gm, .9):>7.1f} {pct(gm, .99):>7.1f} {max(gm):>7.1f}  "
                  f"{r['long_done_ms']['long64k']:>11.0f}/{r['long_done_ms']['long100k']:>11.0f}  "
                  f"{json.dumps(late_first) if late_first else '-'}")
        w, s = results[f"{late}:without"], results[f"{late}:with"]
        print(f"ratio with/without: largest decode gap {max(s['gaps_ms']) / max(w['gaps_ms']):.2f}, "
              f"p90 gap {pct(s['gaps_ms'], .9) / pct(w['gaps_ms'], .9):.2f}, "
              f"100K prompt done {s['long_done_ms']['long100k'] / w['long_done_ms']['long100k']:.2f}\n")


if __name__ == "__main__":
    main()
