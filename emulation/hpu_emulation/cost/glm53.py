"""GLM-5.3 in MXFP4 (ports/glm-5-mxfp4) at its recipe's real shapes, one rank of TP 8 with experts
laid out EP 4 x TP 2 (GLM_MOE_TP=2), traced on meta tensors. Needs the port on the import path
(no vLLM: runs in ``.venv``).

**What runs is the port's own code** where the port has it:

* DSA (GLM_DSA_SPARSE=1 with the recipe's 131,072 window, above the 32,768 threshold): the
  port's ``hpu_dsa._LayerDsa.bias``, the per-step code vllm-gaudi's MLA calls through the port's
  hook: the indexer's keys and queries (``dsa.DsaIndexer``), the key-buffer writes, the scores of
  every query against every key it sees in fp32 and the selection (``prefill_bias`` /
  ``decode_bias``), on meta key buffers of the MLA cache's rows;
* the routed experts: the port's ``hpu_mxk.GlmMxkMoEOp`` (GLM_MXK: the GEMV loop over every
  (token, top-k) pair for calls of at most 16 rows, each gathering the expert's packed bytes
  with ``index_select``; GLM_MXK_PREFILL: every local expert unpacked to bf16, then the stock
  bf16 op, for 256 to 4,096 rows), with the TPC kernels as one op each
  (``hpu_cost::mxfp4_gemv`` / ``mxfp4_unpack``: meta stand-ins whose cost is their bytes);
* the shapes: ``glm5_hpu.memory_plan.glm53_config`` (transformers 5.23.0's ``GlmMoeDsaConfig``,
  the GLM-5.3 shapes the port uses) and ``memory_plan.read_recipe`` (TP, GLM_MOE_TP, MTP).

**What is written here after vLLM's DeepSeek-V2 / GlmMoeDsa layer and vllm-gaudi's ops** (vLLM's
model classes need its TP groups per layer, which a meta build of one rank does not have): the
decoder layer (``hpu::rms_norm`` with the residual, the fused q_a/kv_a GEMM, q_b, kv_b,
``hpu::rotary_pos_embedding``, vllm-gaudi's MLA: FusedSDPA over the chunk and its context with
the DSA bias in prefill, the absorbed latent attention with the block bias in decode; o_proj and
its all-reduce), the router (sigmoid, the correction bias for selection, top-8, normalised,
scaled), the shared expert and dense MLPs, the stock MXFP4 op (vllm-gaudi's
``VllmMixtureOfExpertsOpMXFP4``: one ``hpu::mixture_of_experts.mxfp4_fused_weights``), the MTP
draft layer (``DeepSeekMTP``: enorm, hnorm, eh_proj, one decoder layer, the shared head) and the
LM head with its all-gather.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .hardware import Calibration, Card
from .roofline import LAZY, REPLAY, StepTime, predict
from .trace import OpTrace

BF16, U8 = torch.bfloat16, torch.uint8
MXFP4_BLOCK = 32
#: the serving page's MTP acceptance at the server's default sampling (0.816 over 1,465 drafts):
#: a decode step with one speculative token yields 1 + acceptance tokens a sequence
MTP_ACCEPTANCE = 0.816

_lock = threading.Lock()
_lib: torch.library.Library | None = None


def register_kernels() -> None:
    """``hpu_cost::mxfp4_gemv`` / ``mxfp4_unpack``: the port's TPC kernels as one op each, on meta
    (x [1, K] bf16, packed U8 [N, K/2], scales U8 [N, K/32] -> [1, N]; unpack -> [N, K] bf16)."""
    global _lib
    with _lock:
        if _lib is not None:
            return
        lib = torch.library.Library("hpu_cost", "DEF")
        lib.define("mxfp4_gemv(Tensor x, Tensor packed, Tensor scales) -> Tensor")
        lib.define("mxfp4_unpack(Tensor packed, Tensor scales) -> Tensor")
        lib.impl("mxfp4_gemv", lambda x, p, s: x.new_empty(x.shape[0], p.shape[0]), "Meta")
        lib.impl("mxfp4_unpack", lambda p, s: p.new_empty(p.shape[0], p.shape[1] * 2, dtype=BF16), "Meta")
        _lib = lib


@dataclass(frozen=True)
class Glm53Switches:
    """The switches a case runs with that change what the trace runs (port.yaml ``switches``)."""

    mxk: bool = True  # GLM_MXK
    mxk_prefill: bool = True  # GLM_MXK_PREFILL
    dsa_sparse: bool = True  # GLM_DSA_SPARSE


def _w(*shape, dtype=BF16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


@dataclass(frozen=True)
class _StepMetadata:
    """vllm-gaudi's attention metadata, the fields the port's DSA reads (a dataclass, as the
    runner's own: ``hpu_dsa`` replaces ``attn_bias`` on it)."""

    slot_mapping: torch.Tensor
    block_size: int
    is_prompt: bool
    seq_lens_tensor: torch.Tensor | None = None
    block_list: torch.Tensor | None = None
    attn_bias: torch.Tensor | None = None
    block_mapping: torch.Tensor | None = None


class Glm53Model:
    """The recipe's deployment: one rank's weights (meta) and a traced step."""

    def __init__(self, recipe: Path):
        from glm5_hpu import memory_plan

        self.recipe = recipe
        self.dep = memory_plan.read_recipe(recipe)
        self.cfg = memory_plan.glm53_config()
        c, tp = self.cfg, self.dep.tp
        self.heads = c.num_attention_heads // tp
        self.groups = tp // self.dep.moe_tp  # expert groups (EP 4 x TP 2: 4 groups of 2 cards)
        self.local_experts = c.n_routed_experts // self.groups
        self.local_inter = c.moe_intermediate_size // self.dep.moe_tp
        register_kernels()
        from hpu_emulation import ops as hpu_ops

        hpu_ops.register()
        self._layer = self._layer_weights()

    def _layer_weights(self) -> SimpleNamespace:
        """One decoder layer's weights on this rank (every layer has the same shapes)."""
        c, H = self.cfg, self.heads
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        E, inter, D = self.local_experts, self.local_inter, c.hidden_size
        return SimpleNamespace(
            norm=_w(D),
            qkv_a=_w(c.q_lora_rank + c.kv_lora_rank + c.qk_rope_head_dim, D),
            q_norm=_w(c.q_lora_rank),
            kv_norm=_w(c.kv_lora_rank),
            q_b=_w(H * qk, c.q_lora_rank),
            kv_b=_w(H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
            w_uk_t=_w(H, c.qk_nope_head_dim, c.kv_lora_rank),
            w_uv=_w(H, c.kv_lora_rank, c.v_head_dim),
            o=_w(D, H * c.v_head_dim),
            indexer={
                "wq_b.weight": _w(c.index_n_heads * c.index_head_dim, c.q_lora_rank),
                "wk.weight": _w(c.index_head_dim, D),
                "k_norm.weight": _w(c.index_head_dim),
                "k_norm.bias": _w(c.index_head_dim),
                "weights_proj.weight": _w(c.index_n_heads, D, dtype=torch.float32),
            },
            gate=_w(c.n_routed_experts, D, dtype=torch.float32),
            gate_bias=_w(c.n_routed_experts, dtype=torch.float32),
            shared=[
                _w(c.moe_intermediate_size * c.n_shared_experts // self.dep.tp, D),
                _w(c.moe_intermediate_size * c.n_shared_experts // self.dep.tp, D),
                _w(D, c.moe_intermediate_size * c.n_shared_experts // self.dep.tp),
            ],
            dense=[_w(c.intermediate_size // self.dep.tp, D)] * 2 + [_w(D, c.intermediate_size // self.dep.tp)],
            experts=(
                _w(E, 2 * inter, D // 2, dtype=U8),
                _w(E, 2 * inter, D // MXFP4_BLOCK, dtype=U8),
                _w(E, D, inter // 2, dtype=U8),
                _w(E, D, inter // MXFP4_BLOCK, dtype=U8),
            ),
            embed=_w(c.vocab_size // self.dep.tp, D),
            lm_head=_w(c.vocab_size // self.dep.tp, D),
            eh_proj=_w(D, 2 * D),
        )

    # ---- the step
    def trace(
        self, switches: Glm53Switches, *, tokens: int, context: int, batch: int = 1, draft: bool = True
    ) -> OpTrace:
        """One step: ``batch`` sequences of ``tokens`` new tokens after ``context``; a decode step
        (``tokens`` = 1 + speculative tokens) is followed by the MTP draft's step when ``draft``."""
        trace = OpTrace()
        prompt = tokens > 1 + self.dep.mtp_layers
        with torch.no_grad(), torch.device("meta"), trace:
            ids = torch.zeros(batch * tokens, dtype=torch.int64)
            x = F.embedding(ids, self._layer.embed)
            self._all_reduce(trace, x)
            for i in range(self.cfg.num_hidden_layers):
                x = self._decoder_layer(trace, x, i, switches, prompt, tokens, context, batch)
                if prompt:
                    trace.mark_step()
            h = torch.ops.hpu.rms_norm(x, self._layer.norm, 1e-5)
            last = h.view(batch, tokens, -1)[:, -1] if prompt else h
            self._logits(trace, last)
            if draft and not prompt and self.dep.mtp_layers:
                self._mtp_draft(trace, h.view(batch, tokens, -1)[:, -1], switches, context, batch)
            trace.mark_step()
        return trace

    def _all_reduce(self, trace: OpTrace, x: torch.Tensor) -> torch.Tensor:
        trace.collective("all_reduce", x, self.dep.tp)
        return x

    def _logits(self, trace: OpTrace, h: torch.Tensor) -> None:
        with trace.label("lm_head"):
            logits = F.linear(h, self._layer.lm_head)
            trace.collective("all_gather", logits, self.dep.tp)
            torch.argmax(logits.float(), dim=-1)

    def _mtp_draft(self, trace, hidden, switches, context, batch) -> None:
        """DeepSeekMTP: enorm(embedding) and hnorm(hidden), eh_proj, one decoder layer, the head."""
        L = self._layer
        with trace.label("MTP draft"):
            e = torch.ops.hpu.rms_norm(F.embedding(torch.zeros(batch, dtype=torch.int64), L.embed), L.norm, 1e-5)
            self._all_reduce(trace, e)
            hn = torch.ops.hpu.rms_norm(hidden, L.norm, 1e-5)
            x = F.linear(torch.cat([e, hn], dim=-1), L.eh_proj)
            x = self._decoder_layer(trace, x, self.cfg.num_hidden_layers, switches, False, 1, context + 1, batch)
            self._logits(trace, torch.ops.hpu.rms_norm(x, L.norm, 1e-5))

    def _decoder_layer(self, trace, x, i, switches, prompt, tokens, context, batch):
        L = self._layer
        with trace.label(f"layers.{i}.attention"):
            h = torch.ops.hpu.rms_norm(x, L.norm, 1e-5)
            a = self._attention(trace, h, i, switches, prompt, tokens, context, batch)
            x = x + self._all_reduce(trace, a)
        dense = i < self.cfg.first_k_dense_replace
        with trace.label(f"layers.{i}.{'mlp' if dense else 'moe'}"):
            h = torch.ops.hpu.rms_norm(x, L.norm, 1e-5)
            m = self._mlp(h, L.dense) if dense else self._moe(trace, h, switches, i)
            x = x + self._all_reduce(trace, m)
        return x

    @staticmethod
    def _mlp(h, w):
        return F.linear(F.silu(F.linear(h, w[0])) * F.linear(h, w[1]), w[2])

    def _attention(self, trace, h, i, switches, prompt, tokens, context, batch):
        c, L, H = self.cfg, self._layer, self.heads
        T, nope, rope, kv_lora = h.shape[0], c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
        keys = context + tokens
        bs = self.dep.block_size
        blocks = -(-keys // bs)
        qkv = F.linear(h, L.qkv_a)
        q_c, kv_c, k_pe = qkv.split([c.q_lora_rank, kv_lora, rope], dim=-1)
        q_c = torch.ops.hpu.rms_norm(q_c.contiguous(), L.q_norm, 1e-5)
        kv_c = torch.ops.hpu.rms_norm(kv_c.contiguous(), L.kv_norm, 1e-5)
        q = F.linear(q_c, L.q_b).view(T, H, nope + rope)
        q_nope, q_pe = q.split([nope, rope], dim=-1)
        cos = sin = torch.empty(T, rope, dtype=BF16)
        q_pe = torch.ops.hpu.rotary_pos_embedding(q_pe.contiguous(), sin, cos, None, 0, 0)
        k_pe = torch.ops.hpu.rotary_pos_embedding(k_pe.contiguous().unsqueeze(1), sin, cos, None, 0, 0)
        cache = torch.empty((blocks + 1) * bs * batch, kv_lora + rope, dtype=BF16)
        slots = torch.zeros(T, dtype=torch.int64)
        cache.index_copy_(0, slots, torch.cat([kv_c, k_pe.view(T, rope)], dim=-1))
        bias = None
        if switches.dsa_sparse and self.dep.max_model_len > self._threshold():
            bias = self._dsa_bias(trace, h, q_c, prompt, tokens, context, batch, cache)
        if prompt:
            with trace.label("FusedSDPA"):
                lat = cache[: batch * keys].view(batch, keys, kv_lora + rope)
                kv = F.linear(lat[..., :kv_lora], L.kv_b).view(batch, keys, H, nope + c.v_head_dim)
                k_nope, v = kv.split([nope, c.v_head_dim], dim=-1)
                k = torch.cat([k_nope, lat[..., kv_lora:].unsqueeze(2).expand(batch, keys, H, rope)], dim=-1)
                qh = torch.cat([q_nope, q_pe], dim=-1).view(batch, tokens, H, nope + rope).transpose(1, 2)
                if bias is None and context:
                    bias = torch.zeros(batch, 1, tokens, keys, dtype=BF16)
                o = torch.ops.hpu.sdpa_recomp_fwd(
                    qh,
                    k.transpose(1, 2),
                    v.transpose(1, 2),
                    bias,
                    0.0,
                    (nope + rope) ** -0.5,
                    bias is None,
                    False,
                    "None",
                    None,
                    "right",
                )[0]
                o = o.transpose(1, 2).reshape(T, H * c.v_head_dim)
        else:
            with trace.label("latent attention"):
                # vllm-gaudi's decode rows: each query token (the verify rows of MTP too) reads its
                # sequence's blocks
                q_lat = torch.bmm(q_nope.transpose(0, 1), L.w_uk_t)  # [H, T, kv_lora]
                q_all = torch.cat([q_lat, q_pe.transpose(0, 1)], dim=-1).transpose(0, 1)  # [T, H, 576]
                kv_all = cache[: blocks * bs].unsqueeze(0).expand(T, blocks * bs, kv_lora + rope)
                scores = torch.matmul(q_all, kv_all.transpose(-1, -2))  # [T, H, S]
                if bias is not None:
                    scores = scores + bias.view(T, 1, -1)
                probs = torch.softmax(scores.float(), dim=-1).to(BF16)
                o_lat = torch.matmul(probs, kv_all[..., :kv_lora])  # [T, H, kv_lora]
                o = torch.bmm(o_lat.transpose(0, 1), L.w_uv).transpose(0, 1).reshape(T, -1)
        return F.linear(o, L.o)

    @staticmethod
    def _threshold() -> int:
        from glm5_hpu import hpu_dsa

        return hpu_dsa.threshold({})

    def _dsa_bias(self, trace, h, q_c, prompt, tokens, context, batch, cache):
        """The port's ``_LayerDsa.bias`` for this step (the indexer, key writes, scores, selection)."""
        from glm5_hpu import hpu_dsa
        from glm5_hpu.dsa import DsaIndexer

        c, bs = self.cfg, self.dep.block_size
        keys = context + tokens
        blocks = -(-keys // bs)
        rows = cache.shape[0]
        layer = hpu_dsa._LayerDsa(
            "layer", DsaIndexer(c, self._layer.indexer), c, c.index_topk, self._threshold(), mla_attn=None
        )
        layer.keys = torch.empty(rows, c.index_head_dim, dtype=BF16)
        layer.pos = torch.empty(rows, dtype=torch.int32)
        T = h.shape[0]
        layer.step = {"x": h, "q_resid": q_c, "positions": torch.zeros(T, dtype=torch.int64)}
        ctx_blocks = context // bs
        if prompt:  # one row per sequence; the context's blocks, the chunk's causal bias
            md = _StepMetadata(
                slot_mapping=torch.zeros(T, dtype=torch.int64),
                block_size=bs,
                is_prompt=True,
                seq_lens_tensor=torch.zeros(batch, dtype=torch.int32),
                block_list=torch.zeros(batch * ctx_blocks, dtype=torch.int64) if ctx_blocks else None,
                attn_bias=torch.zeros(batch, 1, tokens, ctx_blocks * bs + tokens, dtype=BF16) if ctx_blocks else None,
            )
        else:  # one decode row per query token (MTP's verify rows too), each with its blocks
            md = _StepMetadata(
                slot_mapping=torch.zeros(T, dtype=torch.int64),
                block_size=bs,
                is_prompt=False,
                block_list=torch.zeros(T * blocks, dtype=torch.int64),
                attn_bias=torch.zeros(T * blocks, bs, dtype=BF16),
                block_mapping=torch.zeros(T * blocks, T, dtype=BF16),
            )
        with trace.label("DSA indexer + selection"):
            out = layer.bias((cache, cache), md)
        return out.attn_bias

    def _moe(self, trace, h, switches, i):
        from glm5_hpu import hpu_mxk

        c, L = self.cfg, self._layer
        with trace.label("router"):
            logits = F.linear(h.float(), L.gate)
            scores = torch.sigmoid(logits)
            _, ids = torch.topk(scores + L.gate_bias, c.num_experts_per_tok, dim=-1)
            weights = scores.gather(1, ids)
            weights = weights / weights.sum(-1, keepdim=True) * c.routed_scaling_factor
        with trace.label("shared expert"):
            shared = self._mlp(h, L.shared)
        stock = _StockMxfp4(
            L.experts, 0, self.local_experts, c.n_routed_experts
        )  # rank 0's group: experts [0, E/groups)
        op = hpu_mxk.GlmMxkMoEOp(
            stock,
            hpu_mxk.Kernels(torch.ops.hpu_cost.mxfp4_gemv, torch.ops.hpu_cost.mxfp4_unpack, "cost model"),
            L.experts,
            decode=switches.mxk,
            prefill=switches.mxk_prefill,
        )
        with trace.label("routed experts"):
            routed = op(h, ids.to(torch.int32), weights.to(BF16))
        return routed + shared

    # ---- predictions
    def step_time(self, switches, *, tokens, context, card: Card, cal: Calibration, batch=1, mode=None) -> StepTime:
        trace = self.trace(switches, tokens=tokens, context=context, batch=batch)
        mode = mode or (REPLAY if batch * tokens <= 2048 else LAZY)
        st = predict(trace.records, mode, card, cal, op_class)
        st.workspace_peak = trace.peak_bytes
        return st

    def decode_tokens_per_step(self) -> float:
        return 1.0 + MTP_ACCEPTANCE * self.dep.mtp_layers


class _StockMxfp4(torch.nn.Module):
    """vllm-gaudi's VllmMixtureOfExpertsOpMXFP4: one hpu::mixture_of_experts.mxfp4_fused_weights call."""

    def __init__(self, experts, first: int, count: int, total: int):
        super().__init__()
        self.w13, self.s13, self.w2, self.s2 = experts
        self.experts_min, self.experts_max, self.total = first, first + count - 1, total

    def forward(self, x, ids, weights, permuted_weights=True, activation="silu"):
        n = self.w13.shape[0]
        return torch.ops.hpu.mixture_of_experts.mxfp4_fused_weights(
            x,
            ids,
            weights,
            [self.w13[e] for e in range(n)],
            [self.w2[e] for e in range(n)],
            [self.s13[e] for e in range(n)],
            [self.s2[e] for e in range(n)],
            MXFP4_BLOCK,
            permuted_weights,
            activation,
            self.experts_min,
            self.experts_max,
            True,
            0,
            self.total,
        )


def op_class(module: str) -> str:
    for key, name in (
        ("MTP draft", "MTP draft"),
        ("routed experts", "MoE routed experts"),
        ("router", "MoE router + shared expert"),
        ("shared expert", "MoE router + shared expert"),
        ("DSA", "DSA indexer + selection"),
        ("FusedSDPA", "MLA attention"),
        ("latent attention", "MLA attention"),
        ("attention", "MLA projections"),
        ("mlp", "dense MLP"),
        ("moe", "MoE router + shared expert"),
        ("lm_head", "embedding + LM head"),
    ):
        if key in module:
            return name
    return "embedding + LM head" if not module else "other"


@functools.lru_cache(maxsize=8)
def dsa_scoring_peak(tokens: int, keys: int, budget: int | None = None) -> int:
    """Peak bytes the port's DSA prefill scoring holds at once (eager) for a ``tokens``-row chunk
    against ``keys`` keys: ``hpu_dsa.prefill_bias`` traced on meta tensors of GLM-5.3's indexer,
    its query chunks bounded by ``budget`` (default ``hpu_dsa.SCORE_BUDGET``)."""
    from glm5_hpu import hpu_dsa, memory_plan

    cfg = memory_plan.glm53_config()
    h, d = cfg.index_n_heads, cfg.index_head_dim
    trace = OpTrace()
    with torch.no_grad(), torch.device("meta"):
        q = torch.empty(1, tokens, h, d, dtype=torch.float32)
        w = torch.empty(1, tokens, h, dtype=torch.float32)
        k = torch.empty(1, keys, d, dtype=BF16)
        kp = torch.zeros(1, keys, dtype=torch.int32)
        qp = torch.zeros(1, tokens, dtype=torch.int64)
        bias = torch.zeros(1, 1, tokens, keys, dtype=BF16)
        with trace:
            hpu_dsa.prefill_bias(
                bias, q, w, k, kp, qp, cfg.index_topk, hpu_dsa.threshold({}), d, budget or hpu_dsa.SCORE_BUDGET
            )
    return trace.peak_bytes
