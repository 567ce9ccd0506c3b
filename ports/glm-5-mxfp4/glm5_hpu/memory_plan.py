"""Per-card memory plan of the GLM-5.3 MXFP4 deployment on Gaudi, from a recipe.

    python -m glm5_hpu.memory_plan --recipe recipes/zai-org/GLM-5.3-BF16/recipe.yaml [--model DIR] [--card gaudi2] [--kv-tokens N]

Exit 0: the KV pool fits under ``--gpu-memory-utilization`` of the card with the weights, and the
card holds it with the DSA indexer-key buffers on top; 1: either does not; 2: the recipe or the
config cannot be planned (the message names the file).

Arithmetic from the config, not vLLM built on the meta device (as the GLM-5.3-Flash plan does):
building vLLM 0.30.0's GlmMoeDsa per rank at TP 8 needs its TP group faked layer by layer; here
each formula mirrors the vLLM 0.30.0 / vllm-gaudi (development base ``091bbad``) line it names,
and the tests hold the checkpoint formula to a real converted checkpoint's files and the KV page
to vLLM's own ``MLAAttentionSpec``.

1. **Config.** ``--model DIR``'s config.json; without it GLM-5.3's shapes as transformers 5.23.0's
   ``GlmMoeDsaConfig`` defaults give them plus one MTP layer (the real config.json was not
   reachable; the output says so).
2. **Checkpoint.** Every tensor the converter writes (Hub names): routed experts U8 E2M1 (two per
   byte) plus a U8 E8M0 scale per 32 inputs, the router bias fp32, the rest BF16.
3. **Weights per card** (TP ``t``, expert parallel with ``GLM_MOE_TP`` = ``m``): column/row
   parallel projections, vocabulary and lm_head split by ``t``; replicated: the fused q_a/kv_a
   projection, the indexer, the router, norms, the MTP ``eh_proj``; routed experts
   ``E / (t/m)`` per card at ``moe_intermediate / m`` (the same bytes as stock EP, ``E / t``
   whole experts). vllm-gaudi's MLA keeps ``W_UK_T`` and ``W_UV`` beside ``kv_b_proj``.
4. **KV pool.** vllm-gaudi's MLA cache holds the latent only (no value cache), per layer
   ``(blocks + 1) x block`` rows of ``kv_lora_rank + qk_rope_head_dim`` bf16 values; the MTP
   layer is one more KV layer. The DSA indexer-key buffers (one per full indexer layer, the MTP
   layer's included) are allocated after profiling with the same rows, ``index_head_dim`` values.
5. **Verdicts**: (a) weights + KV pool <= ``gpu_memory_utilization x card``; (b) weights + KV +
   DSA buffers <= card. What is left is for activations, HPU graphs and the runtime: not known
   here, printed as headroom. Then vllm-gaudi's own sizing (``free after profiling x util x
   (1 - VLLM_GRAPH_RESERVED_MEM)``): what the reported pool implies about memory after profiling.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
CARDS = {"gaudi2": 96 * 10**9, "gaudi3": 128 * 10**9}  # HBM per card, bytes (96 GB = 89.4 GiB)
SEED_KV_TOKENS = 312_960  # the serving page's "Verified" KV pool (2.39 requests at 131,072 tokens)
SEED_CHECKPOINT_GIB = 399  # the serving page's checkpoint size
MXFP4_BLOCK = 32
VOCAB_PAD = 64  # vLLM 0.30.0 vocab_parallel_embedding.py:35 DEFAULT_VOCAB_PADDING_SIZE
BF16, F32, U8 = 2, 4, 1
DSA_DTYPES = {"bf16": 2, "fp8": 1}

ARGS = {
    "--tensor-parallel-size": "tp",
    "--enable-expert-parallel": "ep",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--block-size": "block_size",
    "--gpu-memory-utilization": "utilization",
    "--speculative-config": "speculative",
    "--enforce-eager": "enforce_eager",
}


class PlanError(RuntimeError):
    """The recipe or config cannot be planned (exit 2)."""


@dataclass(frozen=True)
class Deployment:
    """What the recipe's serve args, env and switches say about memory."""

    tp: int
    ep: bool
    moe_tp: int
    block_size: int
    utilization: float
    max_model_len: int
    max_num_seqs: int
    mtp_layers: int
    graph_reserved: float


def read_recipe(recipe: Path, utilization: float | None = None) -> Deployment:
    import yaml

    try:
        data = yaml.safe_load(recipe.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"{recipe}: cannot read the recipe: {exc}") from exc
    if not isinstance(data, dict):
        raise PlanError(f"{recipe}: not a recipe (a mapping)")
    got: dict = {}
    for item in (data.get("serve") or {}).get("args") or []:
        flag, value = next(iter(item.items())) if isinstance(item, dict) else (item, True)
        if flag in ARGS:
            got[ARGS[flag]] = value
    for need in ("tp", "block_size", "utilization"):
        if need not in got:
            flag = next(k for k, v in ARGS.items() if v == need)
            raise PlanError(f"{recipe}: serve.args has no {flag}")
    spec = got.get("speculative") or {}
    if isinstance(spec, str):
        spec = json.loads(spec)
    # One MTP layer per speculative token at most: vLLM's draft for glm_moe_dsa is DeepSeekMTP,
    # whose layers are num_nextn_predict_layers (config), built when the method is mtp.
    mtp = 1 if spec.get("method") == "mtp" else 0
    switches = data.get("switches") or {}
    env = data.get("env") or {}
    tp, moe_tp = int(got["tp"]), int(switches.get("GLM_MOE_TP", 1))
    if not got.get("ep"):
        raise PlanError(f"{recipe}: no --enable-expert-parallel; the MXFP4 experts load only by expert group")
    if tp % moe_tp:
        raise PlanError(f"{recipe}: GLM_MOE_TP {moe_tp} does not divide --tensor-parallel-size {tp}")
    eager = bool(got.get("enforce_eager"))
    return Deployment(
        tp=tp,
        ep=True,
        moe_tp=moe_tp,
        block_size=int(got["block_size"]),
        utilization=float(utilization if utilization is not None else got["utilization"]),
        max_model_len=int(got.get("max_model_len", 0)),
        max_num_seqs=int(got.get("max_num_seqs", 0)),
        mtp_layers=mtp,
        # vllm-gaudi hpu_worker.py:410-413: default 0.1, 0 with --enforce-eager.
        graph_reserved=0.0 if eager else float(env.get("VLLM_GRAPH_RESERVED_MEM", 0.1)),
    )


# ----------------------------------------------------------------------------- config


def glm53_config():
    """GLM-5.3's shapes: transformers 5.23.0's GlmMoeDsaConfig defaults (checkpoint zai-org/GLM-5)
    plus the one MTP layer the release stores as layer 78."""
    from transformers import GlmMoeDsaConfig

    cfg = GlmMoeDsaConfig()
    cfg.num_nextn_predict_layers = 1
    return cfg


def load_config(model_dir: Path):
    from transformers import GlmMoeDsaConfig

    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot read the config: {exc}") from exc
    if raw.get("model_type") != "glm_moe_dsa":
        raise PlanError(f"{path}: model_type {raw.get('model_type')!r}, the plan knows glm_moe_dsa")
    return GlmMoeDsaConfig.from_pretrained(str(model_dir))


def full_indexer(cfg, layer: int) -> bool:
    """vLLM 0.30.0 deepseek_v2.py:1140-1164: a layer builds its indexer unless its type skips the
    top-k; MTP layers (index >= num_hidden_layers) always build one."""
    if layer >= cfg.num_hidden_layers:
        return True
    return cfg.indexer_types[layer] == "full"


# ----------------------------------------------------------------------------- checkpoint


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # safetensors dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * {"BF16": BF16, "F32": F32, "U8": U8}[self.dtype]


def checkpoint_tensors(cfg) -> Iterator[Tensor]:
    """Every tensor of the converted checkpoint (glm5_mxfp4's output, the Hub's names): the source's
    tensors with each routed-expert projection as U8 E2M1 [out, in/2] + U8 E8M0 [out, in/32]."""
    h, v = cfg.hidden_size, cfg.vocab_size
    yield Tensor("model.embed_tokens.weight", "BF16", (v, h))
    yield Tensor("model.norm.weight", "BF16", (h,))
    yield Tensor("lm_head.weight", "BF16", (v, h))
    mtp = getattr(cfg, "num_nextn_predict_layers", 0) or 0
    for i in range(cfg.num_hidden_layers + mtp):
        yield from _layer_tensors(cfg, i, f"model.layers.{i}.")
        if i >= cfg.num_hidden_layers:  # the MTP heads, as the release stores them
            p = f"model.layers.{i}."
            yield from (
                Tensor(p + n, "BF16", (h,)) for n in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight")
            )
            yield Tensor(p + "eh_proj.weight", "BF16", (h, 2 * h))
            yield Tensor(p + "shared_head.head.weight", "BF16", (v, h))


def _layer_tensors(cfg, i: int, p: str) -> Iterator[Tensor]:
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    a = p + "self_attn."
    yield Tensor(a + "q_a_proj.weight", "BF16", (cfg.q_lora_rank, h))
    yield Tensor(a + "q_a_layernorm.weight", "BF16", (cfg.q_lora_rank,))
    yield Tensor(
        a + "q_b_proj.weight", "BF16", (heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), cfg.q_lora_rank)
    )
    yield Tensor(a + "kv_a_proj_with_mqa.weight", "BF16", (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h))
    yield Tensor(a + "kv_a_layernorm.weight", "BF16", (cfg.kv_lora_rank,))
    yield Tensor(a + "kv_b_proj.weight", "BF16", (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank))
    yield Tensor(a + "o_proj.weight", "BF16", (h, heads * cfg.v_head_dim))
    if full_indexer(cfg, min(i, cfg.num_hidden_layers - 1)):  # the MTP layer copies the last layer's set
        x, d, n = a + "indexer.", cfg.index_head_dim, cfg.index_n_heads
        yield Tensor(x + "wq_b.weight", "BF16", (n * d, cfg.q_lora_rank))
        yield Tensor(x + "wk.weight", "BF16", (d, h))
        yield Tensor(x + "k_norm.weight", "BF16", (d,))
        yield Tensor(x + "k_norm.bias", "BF16", (d,))
        yield Tensor(x + "weights_proj.weight", "BF16", (n, h))
    yield Tensor(p + "input_layernorm.weight", "BF16", (h,))
    yield Tensor(p + "post_attention_layernorm.weight", "BF16", (h,))
    m = p + "mlp."
    if i < cfg.first_k_dense_replace:
        inter = cfg.intermediate_size
        yield from (Tensor(m + f"{k}_proj.weight", "BF16", (inter, h)) for k in ("gate", "up"))
        yield Tensor(m + "down_proj.weight", "BF16", (h, inter))
        return
    e, inter, shared = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.moe_intermediate_size * cfg.n_shared_experts
    yield Tensor(m + "gate.weight", "BF16", (e, h))
    yield Tensor(m + "gate.e_score_correction_bias", "F32", (e,))
    yield from (Tensor(m + f"shared_experts.{k}_proj.weight", "BF16", (shared, h)) for k in ("gate", "up"))
    yield Tensor(m + "shared_experts.down_proj.weight", "BF16", (h, shared))
    for j in range(e):
        for k, (out, inp) in (("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter))):
            q = m + f"experts.{j}.{k}_proj."
            yield Tensor(q + "weight", "U8", (out, inp // 2))
            yield Tensor(q + "weight_scale", "U8", (out, inp // MXFP4_BLOCK))


def mxfp4_bytes(out: int, inp: int) -> int:
    """One [out, in] projection in the converter's MXFP4: E2M1 two per byte, one E8M0 per 32."""
    return out * inp // 2 + out * inp // MXFP4_BLOCK


# ----------------------------------------------------------------------------- per card


def card_weights(cfg, dep: Deployment) -> dict[str, int]:
    """Bytes at rest on one card, by component (vLLM 0.30.0 deepseek_v2.py unless named)."""
    t, h, heads = dep.tp, cfg.hidden_size, cfg.num_attention_heads
    layers = cfg.num_hidden_layers + dep.mtp_layers
    moe_layers = layers - cfg.first_k_dense_replace
    out = dict.fromkeys(
        (
            "routed experts (MXFP4)",
            "MLA projections",
            "MLA W_UK_T + W_UV (vllm-gaudi)",
            "DSA indexer",
            "shared experts",
            "router",
            "dense MLPs",
            "norms",
            "embedding + lm_head",
            "MTP heads",
        ),
        0,
    )
    # Routed experts: E / (t/m) experts per card (m cards share an expert group), each at
    # moe_intermediate / m (GLM_MOE_TP); held as loaded, U8 (vllm_gaudi ops/hpu_mxfp4.py:67-99
    # hands each expert's w13/w2 and scales to the MXFP4 op, vLLM's create_weights shapes).
    groups = t // dep.moe_tp
    if cfg.n_routed_experts % groups or cfg.moe_intermediate_size % (dep.moe_tp * MXFP4_BLOCK):
        raise PlanError(
            f"{cfg.n_routed_experts} experts of {cfg.moe_intermediate_size} do not split into "
            f"{groups} groups x GLM_MOE_TP {dep.moe_tp}"
        )
    per_card, inter = cfg.n_routed_experts // groups, cfg.moe_intermediate_size // dep.moe_tp
    out["routed experts (MXFP4)"] = moe_layers * per_card * (mxfp4_bytes(2 * inter, h) + mxfp4_bytes(h, inter))
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    kv_b = heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) // t * cfg.kv_lora_rank
    mla = (
        # fused_qkv_a_proj, replicated (:948-961, :1048)
        (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim) * h
        + heads * qk // t * cfg.q_lora_rank  # q_b_proj, ColumnParallel (:1079)
        + kv_b  # kv_b_proj, ColumnParallel (:1095)
        + h * (heads * cfg.v_head_dim // t)  # o_proj, RowParallel (:1102)
    )
    out["MLA projections"] = layers * mla * BF16
    # W_UK_T and W_UV: kv_b_proj's split, kept beside it (vllm_gaudi attention/oot_mla.py:216-222).
    out["MLA W_UK_T + W_UV (vllm-gaudi)"] = layers * kv_b * BF16
    d, n = cfg.index_head_dim, cfg.index_n_heads
    indexers = sum(full_indexer(cfg, i) for i in range(layers))
    # wq_b ReplicatedLinear (:696), wk_weights_proj disable_tp (:705-710), k_norm LayerNorm fp32
    # weight and bias (layernorm.py:346-347).
    out["DSA indexer"] = indexers * ((n * d * cfg.q_lora_rank + (d + n) * h) * BF16 + 2 * d * F32)
    shared = cfg.moe_intermediate_size * cfg.n_shared_experts
    # DeepseekV2MLP: gate_up MergedColumnParallel, down RowParallel (:261-275).
    out["shared experts"] = moe_layers * 3 * shared // t * h * BF16
    # GateLinear in the model dtype, replicated (:321); e_score_correction_bias fp32 (:328).
    out["router"] = moe_layers * (cfg.n_routed_experts * h * BF16 + cfg.n_routed_experts * F32)
    out["dense MLPs"] = cfg.first_k_dense_replace * 3 * cfg.intermediate_size // t * h * BF16
    # RMSNorms, replicated (:1078, :1094, :1342-1343, :1482).
    out["norms"] = (layers * (2 * h + cfg.q_lora_rank + cfg.kv_lora_rank) + h) * BF16
    vocab = -(-cfg.vocab_size // VOCAB_PAD) * VOCAB_PAD
    # VocabParallelEmbedding (:1456) and ParallelLMHead (:1914), the padded vocabulary split by TP.
    out["embedding + lm_head"] = 2 * (-(-vocab // t)) * h * BF16
    # deepseek_mtp.py: enorm, hnorm (:80-81), eh_proj nn.Linear, replicated (:82), shared_head.norm
    # (:59). Its embed_tokens and shared_head.head are the target's (v1/spec_decode/
    # llm_base_proposer.py:1474-1510, :1573-1584): nothing more on the card.
    out["MTP heads"] = dep.mtp_layers * (3 * h + 2 * h * h) * BF16
    return out


@dataclass(frozen=True)
class KvLayout:
    kv_layers: int
    latent: int  # values per token per MLA layer
    indexer_layers: int
    index_head_dim: int
    block_size: int

    def page_bytes(self) -> int:
        """vLLM's MLAAttentionSpec page (num_kv_heads 1, head_size latent, bf16) over every layer:
        the bytes per block vLLM divides the available memory by (v1/core/kv_cache_utils.py:1750)."""
        return self.kv_layers * self.block_size * self.latent * BF16

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def mla_bytes(self, blocks: int) -> int:
        """vllm-gaudi hpu_model_runner.py:6885-6899: per layer a key cache of get_kv_cache_shape(
        blocks + 1, block, 1, latent) = ((blocks + 1) * block, latent) (hpu_attn.py:114-120), the
        extra block the dummy; no value cache for MLA (v_cache_shape None, :6889)."""
        return self.kv_layers * (blocks + 1) * self.block_size * self.latent * BF16

    def dsa_bytes(self, blocks: int, dtype_bytes: int) -> int:
        """One indexer-key buffer per full indexer layer with the MLA cache's rows."""
        return self.indexer_layers * (blocks + 1) * self.block_size * self.index_head_dim * dtype_bytes


def kv_layout(cfg, dep: Deployment) -> KvLayout:
    layers = cfg.num_hidden_layers + dep.mtp_layers
    return KvLayout(
        # vllm-gaudi get_kv_cache_spec (hpu_model_runner.py:1754-1763) gives every MLAAttention in
        # the forward context (the MTP draft's included) an MLAAttentionSpec; the DSA indexer cache
        # (DeepseekV32IndexerCache) is neither Attention nor MLAAttention: not in the spec.
        kv_layers=layers,
        latent=cfg.kv_lora_rank + cfg.qk_rope_head_dim,
        indexer_layers=sum(full_indexer(cfg, i) for i in range(layers)),
        index_head_dim=cfg.index_head_dim,
        block_size=dep.block_size,
    )


# ----------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    card: str
    card_bytes: int
    dep: Deployment
    kv: KvLayout
    kv_tokens: int
    dsa_dtype: str
    weights: dict[str, int]
    checkpoint_bytes: int
    config_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def weight_bytes(self) -> int:
        return sum(self.weights.values())

    @property
    def blocks(self) -> int:
        return self.kv.blocks(self.kv_tokens)

    @property
    def mla(self) -> int:
        return self.kv.mla_bytes(self.blocks)

    @property
    def dsa(self) -> int:
        return self.kv.dsa_bytes(self.blocks, DSA_DTYPES[self.dsa_dtype])

    @property
    def budget(self) -> int:
        return int(self.dep.utilization * self.card_bytes)

    @property
    def headroom_budget(self) -> int:
        return self.budget - self.weight_bytes - self.mla

    @property
    def headroom_card(self) -> int:
        return self.card_bytes - self.weight_bytes - self.mla - self.dsa

    @property
    def fits(self) -> bool:
        return self.headroom_budget >= 0 and self.headroom_card >= 0

    def max_tokens_in_budget(self) -> int:
        """The largest pool (whole blocks, the dummy block counted) under the budget after weights."""
        room = self.budget - self.weight_bytes
        return max(room // self.kv.page_bytes() - 1, 0) * self.kv.block_size

    def rows(self) -> list[tuple[str, int]]:
        out = [(f"  {k}", v) for k, v in self.weights.items()]
        out.append(("weights", self.weight_bytes))
        out.append(
            (
                f"MLA KV pool ({self.kv.kv_layers} layers x ({self.blocks:,} + 1) blocks x {self.kv.block_size}"
                f" x {self.kv.latent} bf16)",
                self.mla,
            )
        )
        out.append(("weights + KV pool", self.weight_bytes + self.mla))
        out.append((f"budget (gpu_memory_utilization {self.dep.utilization} x card)", self.budget))
        out.append(("(a) headroom under the budget: activations, HPU graphs", self.headroom_budget))
        out.append(
            (
                f"DSA indexer-key buffers ({self.kv.indexer_layers} layers x {self.kv.index_head_dim} {self.dsa_dtype}"
                ", after profiling)",
                self.dsa,
            )
        )
        out.append(("weights + KV pool + DSA buffers", self.weight_bytes + self.mla + self.dsa))
        out.append(("card", self.card_bytes))
        out.append(("(b) headroom on the card: activations, HPU graphs, runtime", self.headroom_card))
        return out

    def gaudi_sizing(self) -> list[str]:
        """vllm-gaudi's own sizing (hpu_worker.py:402-436): pool = free x util x (1 - graph) - one
        block page, free = what the card has free after loading and the profile run."""
        u, g, page = self.dep.utilization, self.dep.graph_reserved, self.kv.page_bytes()
        share = u * (1 - g)
        lo = math.ceil((self.blocks + 1) * page / share)  # free memory that gives exactly this pool
        hi = math.ceil((self.blocks + 2) * page / share) - 1
        left = lo - self.mla
        out = [
            f"vllm-gaudi sizes the pool from the memory free after loading and profiling, not from the card: "
            f"KV = free x {u} x (1 - VLLM_GRAPH_RESERVED_MEM {g}) - one block page ({page:,} bytes), in whole blocks "
            "(vllm_gaudi/v1/worker/hpu_worker.py:402-436; vLLM kv_cache_utils.py:1750).",
            f"A pool of {self.kv_tokens:,} tokens means {lo / GIB:.2f} to {hi / GIB:.2f} GiB free after profiling "
            f"({lo:,} to {hi:,} bytes): the card less the weights less that leaves "
            f"{(self.card_bytes - self.weight_bytes - hi) / GIB:.2f} to {(self.card_bytes - self.weight_bytes - lo) / GIB:.2f} GiB "
            "taken by the runtime, the profile run's workspace and anything else before KV.",
            f"After the pool, {left / GIB:.2f} GiB of that free memory remains ({1 - share:.3f} of it); the DSA buffers take "
            f"{self.dsa / GIB:.2f} GiB of it, leaving {(left - self.dsa) / GIB:.2f} GiB for HPU graphs and activations "
            f"(at the lower bound).",
        ]
        need = self.weight_bytes + lo
        if need > self.card_bytes:
            out.append(
                f"So the reported pool needs at least {need:,} bytes ({need / GIB:.2f} GiB) usable on the card before "
                f"any workspace, more than this plan's card ({self.card_bytes:,}): the card exposes more (96 GiB would "
                f"be {96 * GIB:,} bytes), or the real weights are smaller than these (the real config.json differs)."
            )
        free_max = self.card_bytes - self.weight_bytes
        best = max(int(free_max * share) - page, 0) // page * self.kv.block_size
        out.append(f"Upper bound if nothing but the weights were on the card before KV: {best:,} tokens.")
        return out

    def render(self) -> str:
        d = self.dep
        head = (
            f"GLM-5.3 MXFP4 memory plan: {self.card} ({self.card_bytes / GIB:.1f} GiB per card), TP {d.tp} with expert "
            f"parallel, experts EP {d.tp // d.moe_tp} x TP {d.moe_tp} (GLM_MOE_TP); block {d.block_size}; "
            f"{d.mtp_layers} MTP layer(s); KV pool checked: {self.kv_tokens:,} tokens = {self.blocks:,} blocks"
        )
        if d.max_model_len:
            head += f" ({self.kv_tokens / d.max_model_len:.2f} requests at {d.max_model_len:,})"
        lines = [
            head,
            f"config: {self.config_source}",
            "",
            f"checkpoint (MXFP4 routed experts, the rest BF16): {self.checkpoint_bytes:,} bytes = "
            f"{self.checkpoint_bytes / GIB:.1f} GiB (the serving page says {SEED_CHECKPOINT_GIB} GiB)",
            "",
            "| per card | bytes | GiB |",
            "|---|---:|---:|",
        ]
        for name, n in self.rows():
            lines.append(f"| {name} | {n:,} | {n / GIB:.2f} |")
        lines.append("")
        lines.append(f"largest KV pool under the budget after the weights: {self.max_tokens_in_budget():,} tokens")
        lines += [f"note: {n}" for n in self.notes + self.gaudi_sizing()]
        a = "yes" if self.headroom_budget >= 0 else "NO"
        b = "yes" if self.headroom_card >= 0 else "NO"
        lines.append(
            f"(a) {self.kv_tokens:,} tokens fit inside {d.utilization} x card with the weights: {a} "
            f"({self.headroom_budget / GIB:+.2f} GiB)"
        )
        lines.append(
            f"(b) the card holds weights + KV + DSA buffers: {b} ({self.headroom_card / GIB:+.2f} GiB, "
            f"{(self.weight_bytes + self.mla + self.dsa) / self.card_bytes:.1%} of the card)"
        )
        lines.append(f"verdict: {'FITS' if self.fits else 'DOES NOT FIT'}")
        return "\n".join(lines)


def plan(
    recipe: Path,
    model_dir: Path | None = None,
    card: str = "gaudi2",
    kv_tokens: int = SEED_KV_TOKENS,
    dsa_dtype: str = "bf16",
    utilization: float | None = None,
) -> Plan:
    dep = read_recipe(recipe, utilization)
    if model_dir is None:
        cfg = glm53_config()
        source = (
            "GLM-5.3's real config.json was not available: transformers 5.23.0 GlmMoeDsaConfig defaults "
            "(zai-org/GLM-5 shapes, every indexer layer full) + 1 MTP layer; --model DIR reads a real one"
        )
    else:
        cfg = load_config(model_dir)
        source = f"{Path(model_dir) / 'config.json'}"
    if dep.mtp_layers and not getattr(cfg, "num_nextn_predict_layers", 0):
        raise PlanError(f"{recipe}: the speculative method is mtp but the config has no num_nextn_predict_layers")
    p = Plan(
        card=card,
        card_bytes=CARDS[card],
        dep=dep,
        kv=kv_layout(cfg, dep),
        kv_tokens=kv_tokens,
        dsa_dtype=dsa_dtype,
        weights=card_weights(cfg, dep),
        checkpoint_bytes=sum(t.nbytes for t in checkpoint_tensors(cfg)),
        config_source=source,
    )
    p.notes += [
        "MLA KV on vllm-gaudi: the latent only, kv_lora_rank + qk_rope_head_dim values per token per layer, "
        "replicated on every card (one KV head); no value cache is allocated for MLA.",
        f"DSA buffers assumed {dsa_dtype}: the model dtype, as the port keeps indexer keys (glm5_hpu/dsa.py); vLLM's own "
        f"indexer cache is fp8 + an fp32 scale per 128 (132 bytes a token, deepseek_v2.py:721-726), written by CUDA "
        f"kernels only. With that layout they would be "
        f"{p.kv.indexer_layers * (p.blocks + 1) * p.kv.block_size * (cfg.index_head_dim + cfg.index_head_dim // 128 * 4) / GIB:.2f} GiB.",
        f"Checkpoint: of the total, the MTP layer's shared_head.head (as the tiny checkpoint and DeepSeek's layout store "
        f"it) is {cfg.vocab_size * cfg.hidden_size * BF16 / GIB:.2f} GiB; without it "
        f"{(p.checkpoint_bytes - cfg.vocab_size * cfg.hidden_size * BF16 * dep.mtp_layers) / GIB:.1f} GiB. On the card it "
        "is the target's lm_head (not loaded twice).",
        "Not counted: activations, the profile run's workspace, HPU graphs, the HPU runtime's own reservation, "
        "rotary caches, sampler and MTP buffers: the headroom rows are what is left for them.",
    ]
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5_hpu.memory_plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", required=True, type=Path, help="a recipe.yaml (serve args, env and switches)")
    ap.add_argument("--model", type=Path, help="a folder with the checkpoint's config.json (default: GLM-5.3's shapes)")
    ap.add_argument("--card", choices=sorted(CARDS), default="gaudi2")
    ap.add_argument(
        "--kv-tokens",
        type=int,
        default=SEED_KV_TOKENS,
        help=f"the KV pool to check, in tokens (default {SEED_KV_TOKENS:,}: the serving page's)",
    )
    ap.add_argument("--dsa-dtype", choices=sorted(DSA_DTYPES), default="bf16", help="the DSA indexer keys' dtype")
    ap.add_argument("--gpu-memory-utilization", type=float, help="override the recipe's")
    ns = ap.parse_args(argv)
    try:
        p = plan(ns.recipe, ns.model, ns.card, ns.kv_tokens, ns.dsa_dtype, ns.gpu_memory_utilization)
    except PlanError as exc:
        print(f"memory_plan: {exc}", file=sys.stderr)
        return 2
    print(p.render())
    return 0 if p.fits else 1


if __name__ == "__main__":
    sys.exit(main())
