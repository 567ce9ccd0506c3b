"""GLM-5.3-Flash in plain PyTorch, top to bottom, one class per block.

Module and parameter names follow the *checkpoint* keys (``model.language_model.*``,
``model.visual.*``, ``lm_head``), so ``weights.py`` only has to handle the few tensors
that are stored differently (per-expert MoE weights -> stacked w13/w2).

Layers: KDA (linear attention) or NoPE MLA (dense; the DSA indexer is built and
testable but skipped by default, exact up to ``dense_equals_sparse``), dense or MoE MLP,
both wrapped in mHC streams. Takes the transformers ``Glm5NextConfig`` object.
"""

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import validate_config
from .kda import causal_conv1d, chunk_kda, fused_recurrent_kda, kda_gate
from .mhc import hc_head, hc_post, hc_pre


# --------------------------------------------------------------------------- cache


@dataclass
class Glm5NextCache:
    """Decode state: per KDA layer (conv window, fp32 recurrent state), per MLA layer the
    normalised latent c [B, T, kv_lora_rank]; plus which cached keys are real (not padding)."""

    seq_len: int = 0
    key_valid: torch.Tensor | None = None  # [B, seq_len] bool
    conv: dict = field(default_factory=dict)
    recurrent: dict = field(default_factory=dict)
    latent: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- basics


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    # GLM clamps the gate from above only, before silu, and the up projection both ways.
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


class MLP(nn.Module):
    """Dense SwiGLU MLP with the swiglu_limit clamp (dense layers, shared expert, vision)."""

    def __init__(self, hidden: int, intermediate: int, limit: float, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


# --------------------------------------------------------------------------- MoE


class Router(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(config.n_routed_experts), requires_grad=False)
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.scale = config.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (weights [T, top_k] fp32, expert ids [T, top_k])."""
        # fp32 routing: bf16 logits flip near-tied experts.
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        # The correction bias steers *selection* only; the weights are the unbiased scores.
        choice = scores + self.e_score_correction_bias.float()
        if self.n_group > 1:
            grouped = choice.view(x.shape[0], self.n_group, -1)
            group_score = grouped.topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(self.topk_group, dim=-1).indices, 1.0)
            choice = choice.masked_fill(~keep.bool().repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        ids = choice.topk(self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scale, ids


class Experts(nn.Module):
    """Routed experts stacked as vLLM's FusedMoE holds them: w13 = [gate; up], w2 = down."""

    def __init__(self, config):
        super().__init__()
        E, D, I = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.w13_weight = nn.Parameter(torch.zeros(E, 2 * I, D))
        self.w2_weight = nn.Parameter(torch.zeros(E, D, I))
        self.limit = config.swiglu_limit

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            tok, slot = torch.where(ids == e)
            gate, up = F.linear(x[tok], self.w13_weight[e]).chunk(2, dim=-1)
            y = F.linear(clamped_swiglu(gate, up, self.limit), self.w2_weight[e])
            out.index_add_(0, tok, (y * weights[tok, slot, None]).to(x.dtype))
        return out


class MoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = Router(config)
        self.experts = Experts(config)
        self.shared_experts = MLP(
            config.hidden_size, config.moe_intermediate_size * config.n_shared_experts, config.swiglu_limit
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat)
        # The shared expert is added unscaled (routed_scaling_factor applies to routed weights only).
        return self.experts(flat, weights, ids).view_as(x) + self.shared_experts(x)


# --------------------------------------------------------------------------- KDA


class KimiDeltaAttention(nn.Module):
    """KDA layer: q/k/v -> short conv + silu -> bounded gate, beta -> KDA -> gated RMSNorm -> o_proj."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        D, H, K = config.hidden_size, config.linear_num_heads, config.linear_head_dim
        self.num_heads, self.head_dim = H, K
        W = config.linear_conv_kernel_dim
        for name in ("q", "k", "v"):
            setattr(self, f"{name}_proj", nn.Linear(D, H * K, bias=False))
            setattr(self, f"{name}_conv1d", nn.Conv1d(H * K, H * K, W, groups=H * K, bias=False))
        self.f_a_proj = nn.Linear(D, K, bias=False)
        self.f_b_proj = nn.Linear(K, H * K, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(H * K))
        self.A_log = nn.Parameter(torch.zeros(H))  # flat [H], as on disk
        self.b_proj = nn.Linear(D, H, bias=False)
        self.g_a_proj = nn.Linear(D, K, bias=False)
        self.g_b_proj = nn.Linear(K, H * K, bias=False)
        self.o_norm = RMSNorm(K, config.rms_norm_eps)
        self.o_proj = nn.Linear(H * K, D, bias=False)
        self.lower_bound = config.linear_lower_bound

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: Glm5NextCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        # Padding must not reach the recurrence. torch.where (not a multiply) also clears NaN
        # in padded slots: 0 * NaN = NaN would poison every later query.
        x = torch.where(mask[..., None], x, torch.zeros((), dtype=x.dtype))
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1).transpose(1, 2)
        weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], dim=0).squeeze(1)
        conv_state = cache.conv.get(self.layer_idx) if cache is not None else None
        qkv, new_conv_state = causal_conv1d(qkv, weight, conv_state)
        q, k, v = qkv.transpose(1, 2).reshape(B, T, 3, self.num_heads, self.head_dim).unbind(2)

        g = kda_gate(self.f_b_proj(self.f_a_proj(x)), self.A_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(self.b_proj(x))
        state = cache.recurrent.get(self.layer_idx) if cache is not None else None
        if state is not None and T == 1:
            o, state = fused_recurrent_kda(q, k, v, g, beta, initial_state=state, mask=mask)
        else:
            o, state = chunk_kda(q, k, v, g, beta, initial_state=state, mask=mask)
        if cache is not None:
            cache.conv[self.layer_idx] = new_conv_state
            cache.recurrent[self.layer_idx] = state

        gate = self.g_b_proj(self.g_a_proj(x)).view(B, T, self.num_heads, self.head_dim)
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.o_norm.eps)
        of = self.o_norm.weight.float() * of * torch.sigmoid(gate.float())
        return self.o_proj(of.to(x.dtype).reshape(B, T, -1))


# --------------------------------------------------------------------------- MLA + DSA indexer


def dense_equals_sparse(num_visible_keys: int, index_topk: int, index_kpool: int, select_tail: bool = True) -> bool:
    """True when the DSA selection for a query seeing ``num_visible_keys`` valid keys is every key.

    The indexer picks min(index_topk // kpool, #pools) complete pools (a pool is kpool
    consecutive real tokens from the first real one) and, with select_tail, appends the
    incomplete tail (< kpool tokens). So all keys are selected iff
    floor(n / kpool) <= index_topk // kpool (and the tail is selected, or n % kpool == 0),
    i.e. n <= index_topk + kpool - 1 with the tail on: 2,063 keys for 2048 / 16.
    """
    n = num_visible_keys
    if n // index_kpool > index_topk // index_kpool:
        return False
    return select_tail or n % index_kpool == 0


class Indexer(nn.Module):
    """DSA k-pool indexer (own implementation, prefill without cache), used to measure dense vs sparse."""

    def __init__(self, config):
        super().__init__()
        self.n_heads, self.head_dim = config.index_n_heads, config.index_head_dim
        self.topk, self.kpool = config.index_topk, config.index_kpool
        self.select_tail = config.index_kpool_always_select_tail
        self.wq_b = nn.Linear(config.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(config.hidden_size, self.n_heads, bias=False)
        self.index_kpool_compress_ape = nn.Parameter(torch.zeros(self.kpool, self.head_dim))
        self.index_kpool_compress_gate = nn.Parameter(torch.zeros(self.head_dim, config.hidden_size))

    @torch.no_grad()
    def selection_mask(self, x: torch.Tensor, q_resid: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, S, D], q_resid [B, S, q_lora], mask [B, S] -> bool [B, S, S]: key j selected for query i."""
        B, S, _ = x.shape
        P = self.kpool
        q = self.wq_b(q_resid).view(B, S, self.n_heads, self.head_dim).float()
        k = self.k_norm(self.wk(x)).float()
        gate = F.linear(x, self.index_kpool_compress_gate).float()
        pos = torch.arange(S)
        first = torch.where(mask.any(-1), mask.long().argmax(-1), torch.full((B,), S))
        n_pools = (S + P - 1) // P
        # Token index of slot t of pool p: first + p * P + t.
        tok = first[:, None, None] + torch.arange(n_pools * P).view(1, n_pools, P)
        in_range = tok < S
        tok_c = tok.clamp(max=S - 1)
        bidx = torch.arange(B)[:, None, None]
        valid = in_range & mask[bidx, tok_c]
        pool_ok = valid.all(-1)  # [B, n_pools]
        logits = (gate[bidx, tok_c] + self.index_kpool_compress_ape.float()).masked_fill(~valid[..., None], float("-inf"))
        probs = torch.nan_to_num(logits.softmax(dim=2))
        pool_k = (probs * k[bidx, tok_c]).sum(2)  # [B, n_pools, Dh]
        scores = F.relu(torch.einsum("bshd,bpd->bshp", q, pool_k) * self.head_dim**-0.5)
        w = self.weights_proj(x).float() * self.n_heads**-0.5
        index = torch.einsum("bsh,bshp->bsp", w, scores)
        visible = (pos[None, :] <= pos[:, None])[None] & mask[:, None, :]  # [B, S, S]
        pool_end = tok[..., -1].clamp(max=S - 1)
        cand = pool_ok[:, None, :] & visible.gather(2, pool_end[:, None, :].expand(B, S, -1))
        index = index.masked_fill(~cand, torch.finfo(index.dtype).min)
        n_sel = min(self.topk // P, n_pools)
        chosen = index.topk(n_sel, dim=-1).indices
        chosen_ok = cand.gather(2, chosen)
        sel_pool = torch.zeros(B, S, n_pools, dtype=torch.bool).scatter_(2, chosen, chosen_ok)
        # Expand the chosen pools back to tokens: key j belongs to pool (j - first) // P.
        pool_of = ((pos[None, :] - first[:, None]) // P).clamp(0, n_pools - 1)
        sel = sel_pool.gather(2, pool_of[:, None, :].expand(B, S, S)) & (pos[None, :] >= first[:, None])[:, None, :]
        if self.select_tail:
            count = visible.long().sum(-1)  # [B, S]
            tail_start = first[:, None] + count - count.remainder(P)
            tail = (pos[None, None, :] >= tail_start[..., None]) & visible
            sel = sel | tail
        return sel & visible & mask[:, :, None]


class MLAAttention(nn.Module):
    """NoPE multi-head latent attention (qk_rope_head_dim = 0): no positional signal at all.

    Runs dense (every causal, non-padded key), which equals the DSA selection while
    ``dense_equals_sparse`` holds (up to index_topk + kpool - 1 keys).
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        D, H = config.hidden_size, config.num_attention_heads
        self.num_heads, self.nope, self.v_dim = H, config.qk_nope_head_dim, config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_a_proj = nn.Linear(D, config.q_lora_rank, bias=config.attention_bias)
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, H * self.nope, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, config.kv_lora_rank, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, config.rms_norm_eps)
        self.kv_b_proj = nn.Linear(config.kv_lora_rank, H * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(H * self.v_dim, D, bias=config.attention_bias)
        self.indexer = Indexer(config)
        self.use_indexer = False  # dense by default; True applies the DSA selection (prefill only)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: Glm5NextCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        q_resid = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_resid).view(B, T, self.num_heads, self.nope).transpose(1, 2)
        c = self.kv_a_layernorm(self.kv_a_proj_with_mqa(x))  # the cached latent
        past = 0
        key_valid = mask
        if cache is not None:
            past = cache.seq_len
            if self.layer_idx in cache.latent:
                c = torch.cat([cache.latent[self.layer_idx], c], dim=1)
            cache.latent[self.layer_idx] = c
            key_valid = cache.key_valid
        # Padded keys are masked out of the softmax, but 0 * NaN = NaN in probs @ v: clear them.
        c_keys = torch.where(key_valid[..., None], c, torch.zeros((), dtype=c.dtype))
        k_nope, v = self.kv_b_proj(c_keys).view(B, -1, self.num_heads, self.nope + self.v_dim).transpose(1, 2).split(
            [self.nope, self.v_dim], dim=-1
        )
        S = c.shape[1]
        visible = torch.arange(S)[None, :] <= (past + torch.arange(T))[:, None]
        allowed = visible[None] & key_valid[:, None, :]  # [B, T, S]
        if self.use_indexer:
            if cache is not None and past:
                raise NotImplementedError("the port's indexer covers prefill without cache")
            allowed = allowed & self.indexer.selection_mask(x, q_resid, mask)
        scores = torch.matmul(q, k_nope.transpose(-1, -2)) * self.nope**-0.5
        # finfo.min, not -inf: a fully masked (padding) query row stays finite, as in the reference.
        scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(out)


# --------------------------------------------------------------------------- decoder


def add_layer_body(layer: nn.Module, config, layer_idx: int, *, requires_grad: bool = True) -> None:
    """What a decoder layer holds besides its attention, here and in the vLLM model: the MLP
    (MoE or dense), the two norms and the mHC parameters (fp32, checkpoint names)."""
    layer.mlp = (
        MoE(config)
        if config.mlp_layer_types[layer_idx] == "sparse"
        else MLP(config.hidden_size, config.intermediate_size, config.swiglu_limit)
    )
    layer.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
    layer.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
    n, width = config.hc_mult, (2 + config.hc_mult) * config.hc_mult
    f32 = dict(dtype=torch.float32)
    for half in ("attn", "ffn"):
        setattr(layer, f"hc_{half}_fn", nn.Parameter(torch.zeros(width, n * config.hidden_size, **f32), requires_grad=requires_grad))
        setattr(layer, f"hc_{half}_base", nn.Parameter(torch.zeros(width, **f32), requires_grad=requires_grad))
        setattr(layer, f"hc_{half}_scale", nn.Parameter(torch.ones(3, **f32), requires_grad=requires_grad))


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.is_kda = config.layer_types[layer_idx] == "linear_attention"
        self.self_attn = KimiDeltaAttention(config, layer_idx) if self.is_kda else MLAAttention(config, layer_idx)
        add_layer_body(self, config, layer_idx)
        self.hc_args = dict(rms_eps=config.rms_norm_eps, hc_eps=config.hc_eps, iters=config.hc_sinkhorn_iters)

    def hc(self, half: str, X: torch.Tensor):
        p = lambda s: getattr(self, f"hc_{half}_{s}")  # noqa: E731
        return hc_pre(X, p("fn"), p("base"), p("scale"), **self.hc_args)

    def forward(self, X: torch.Tensor, mask: torch.Tensor, cache: Glm5NextCache | None) -> torch.Tensor:
        post, comb, x = self.hc("attn", X)
        X = hc_post(self.self_attn(self.input_layernorm(x), mask, cache), X, post, comb)
        post, comb, x = self.hc("ffn", X)
        return hc_post(self.mlp(self.post_attention_layernorm(x)), X, post, comb)


class TextModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, inputs_embeds: torch.Tensor, mask: torch.Tensor, cache: Glm5NextCache | None) -> torch.Tensor:
        # One token embedding copied into hc_mult streams.
        X = inputs_embeds.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1).contiguous()
        for layer in self.layers:
            X = layer(X, mask, cache)
        return self.norm(hc_head(X))


# --------------------------------------------------------------------------- vision


class VisionAttention(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.num_heads = vc.num_heads
        self.head_dim = vc.hidden_size // vc.num_heads
        self.qkv = nn.Linear(vc.hidden_size, 3 * vc.hidden_size, bias=vc.attention_bias)
        self.proj = nn.Linear(vc.hidden_size, vc.hidden_size, bias=vc.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, vc.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, vc.rms_norm_eps)

    def forward(self, x: torch.Tensor, cu_seqlens: list[int], cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        L = x.shape[0]
        q, k, v = self.qkv(x).view(L, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = (_rope(t, cos, sin) for t in (q, k))
        out = torch.empty_like(v)
        for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:]):  # non-causal attention within each image/frame
            qh, kh, vh = (t[s:e].transpose(0, 1) for t in (q, k, v))
            probs = (torch.matmul(qh, kh.transpose(-1, -2)) * self.head_dim**-0.5).softmax(-1, dtype=torch.float32)
            out[s:e] = torch.matmul(probs.to(vh.dtype), vh).transpose(0, 1)
        return self.proj(out.reshape(L, -1))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # NeoX rotate-half, in fp32.
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionBlock(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.norm1 = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.norm2 = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.attn = VisionAttention(vc)
        self.mlp = MLP(vc.hidden_size, vc.intermediate_size, vc.swiglu_limit, bias=vc.attention_bias)

    def forward(self, x, cu_seqlens, cos, sin):
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, vc):
        super().__init__()
        kernel = (vc.temporal_patch_size, vc.patch_size, vc.patch_size)
        self.proj = nn.Conv3d(vc.in_channels, vc.hidden_size, kernel_size=kernel, stride=kernel)
        self.in_channels, self.kernel = vc.in_channels, kernel

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # Kernel = stride = the whole patch, so the conv is one matmul per flattened patch.
        w = self.proj.weight.flatten(1)
        return F.linear(pixels.to(w.dtype).view(-1, w.shape[1]), w, self.proj.bias)


class PatchMerger(nn.Module):
    def __init__(self, dim: int, context_dim: int, limit: float):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.post_projection_norm = nn.LayerNorm(dim)
        self.gate_proj = nn.Linear(dim, context_dim, bias=False)
        self.up_proj = nn.Linear(dim, context_dim, bias=False)
        self.down_proj = nn.Linear(context_dim, dim, bias=False)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.post_projection_norm(self.proj(x)))
        return self.down_proj(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


class VisionModel(nn.Module):
    """Patch embed -> blocks with axial 2D RoPE -> RMSNorm -> 2x2 downsample conv -> merger."""

    def __init__(self, vc):
        super().__init__()
        self.config = vc
        self.merge = vc.spatial_merge_size
        self.patch_embed = PatchEmbed(vc)
        self.blocks = nn.ModuleList(VisionBlock(vc) for _ in range(vc.depth))
        self.post_layernorm = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.downsample = nn.Conv2d(vc.hidden_size, vc.out_hidden_size, kernel_size=self.merge, stride=self.merge)
        self.merger = PatchMerger(vc.out_hidden_size, vc.projection_intermediate_size, vc.swiglu_limit)
        head_dim = vc.hidden_size // vc.num_heads
        theta = (vc.rope_parameters or {}).get("rope_theta", 10000.0)
        spatial = head_dim // 2
        self.register_buffer(
            "inv_freq", 1.0 / theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial), persistent=False
        )

    def rotary(self, grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        pos, cu = [], [0]
        m = self.merge
        for t, h, w in grid_thw.tolist():
            hh = torch.arange(h)[:, None].expand(h, w)
            ww = torch.arange(w)[None, :].expand(h, w)
            # Patches arrive block-major over m x m merge windows.
            order = lambda a: a.reshape(h // m, m, w // m, m).transpose(1, 2).flatten()  # noqa: E731
            pos.append(torch.stack([order(hh), order(ww)], dim=-1).repeat(t, 1))
            cu.extend(cu[-1] + h * w * (i + 1) for i in range(t))
        pos = torch.cat(pos)
        freqs = pos[..., None].float() * self.inv_freq  # [L, 2, F]
        angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin(), cu

    def forward(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        cos, sin, cu = self.rotary(grid_thw)
        x = self.patch_embed(pixels)
        for blk in self.blocks:
            x = blk(x, cu, cos, sin)
        x = self.post_layernorm(x)
        x = x.view(-1, self.merge, self.merge, x.shape[-1]).permute(0, 3, 1, 2)
        x = self.downsample(x).view(-1, self.config.out_hidden_size)
        return self.merger(x)


# --------------------------------------------------------------------------- top level


class Glm5NextModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.visual = VisionModel(config.vision_config)
        self.language_model = TextModel(config.text_config)


class Glm5NextForConditionalGeneration(nn.Module):
    """Text + image model. ``forward`` returns logits; ``greedy_generate`` decodes with the cache."""

    def __init__(self, config, tp_size: int = 1, prefix_caching: bool = False):
        super().__init__()
        validate_config(config, tp_size=tp_size, prefix_caching=prefix_caching)
        self.config = config
        self.model = Glm5NextModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)

    def embed(self, input_ids, pixel_values=None, image_grid_thw=None) -> torch.Tensor:
        emb = self.model.language_model.embed_tokens(input_ids)
        if pixel_values is not None:
            image = self.model.visual(pixel_values, image_grid_thw).to(emb.dtype)
            slots = input_ids == self.config.image_token_id
            if int(slots.sum()) != image.shape[0]:
                raise ValueError(f"{int(slots.sum())} image tokens in the prompt, {image.shape[0]} image embeddings")
            emb = emb.masked_scatter(slots[..., None], image)
        return emb

    def forward(self, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None, cache=None):
        """input_ids [B, T]; attention_mask [B, T] for the new tokens (True/1 = real)."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if cache is not None:
            cache.key_valid = mask if cache.key_valid is None else torch.cat([cache.key_valid, mask], dim=1)
        h = self.model.language_model(self.embed(input_ids, pixel_values, image_grid_thw), mask, cache)
        if cache is not None:
            cache.seq_len += input_ids.shape[1]
        return self.lm_head(h)

    @torch.no_grad()
    def greedy_generate(self, input_ids, max_new_tokens, attention_mask=None, pixel_values=None, image_grid_thw=None):
        """Prefill (chunked KDA) then one recurrent decode step per token. Returns [B, T + new]."""
        cache = Glm5NextCache()
        logits = self(input_ids, attention_mask, pixel_values, image_grid_thw, cache=cache)
        out = [input_ids]
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            logits = self(nxt, cache=cache)
        return torch.cat(out, dim=1)
