"""NoPE multi-head latent attention (qk_rope_head_dim = 0) and the DSA k-pool indexer.

The attention runs dense: every causal, non-padded key. That equals the DSA selection
while ``dense_equals_sparse`` holds (up to index_topk + index_kpool - 1 keys); the
indexer is built, loaded and testable, and applied only with ``use_indexer``.
Checkpoint names: ``layers.{i}.self_attn.*`` and ``layers.{i}.self_attn.indexer.*``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .norm import RMSNorm


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
        logits = (gate[bidx, tok_c] + self.index_kpool_compress_ape.float()).masked_fill(
            ~valid[..., None], float("-inf")
        )
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache=None) -> torch.Tensor:
        """x [B, T, D]; mask [B, T] (True = real token); cache: a ``reference.Glm5NextCache`` or None."""
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
        k_nope, v = (
            self.kv_b_proj(c_keys)
            .view(B, -1, self.num_heads, self.nope + self.v_dim)
            .transpose(1, 2)
            .split([self.nope, self.v_dim], dim=-1)
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
