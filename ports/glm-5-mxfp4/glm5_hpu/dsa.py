"""DSA (DeepSeek sparse attention) of glm_moe_dsa, reference path (PyTorch, one sequence at a time).

The model's attention is MLA whose keys are chosen per query by a small indexer. GLM_DSA_SPARSE
decides when the choice applies:

* a query that sees more than ``threshold`` keys (the recipe: 32,768) attends only to the
  ``index_topk`` keys (2,048) its indexer scores highest among the keys it may see;
* a query that sees ``threshold`` keys or fewer attends to all of them: exact dense attention;
* GLM_DSA_SPARSE=0 (the reference path when off): dense attention at every length, which is
  what vllm-gaudi's dense-MLA fallback runs.

The rule is per query, by the number of keys that query sees (its position + 1), so a prompt's
output does not depend on how it is split into prefill chunks and decode steps. transformers
5.23.0 applies the top-k at every length (its threshold is index_topk); with ``threshold`` set
to ``index_topk`` this module selects and attends exactly as it does (the tests compare them).

Names follow the checkpoint: ``self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
kv_a_layernorm, kv_b_proj, o_proj}`` and ``self_attn.indexer.{wq_b, wk, k_norm, weights_proj}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

DENSE_UNTIL_KEYS = 32768  # up to this many visible keys a query attends to all of them; past it, to its top-k


def rope_cos_sin(config, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [S, qk_rope_head_dim] for ``positions`` (default RoPE; others are refused)."""
    params = config.rope_parameters or {}
    if params.get("rope_type", "default") != "default":
        raise NotImplementedError(
            f"rope_type {params.get('rope_type')!r}: the reference implements the default RoPE only"
        )
    dim = config.qk_rope_head_dim
    # Built on the positions' device: a host tensor in a card op is refused in eager mode and, in
    # lazy mode inside a captured HPU graph, frozen at its capture value.
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float()
    inv_freq = 1.0 / (params["rope_theta"] ** (steps / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x0, x1), (x2, x3), ... of x [S, ..., R] by position; the result holds the
    rotated even members, then the odd ones (the layout the model's keys and queries share).
    cos, sin [S, R] (the angle repeated twice, as rope_cos_sin builds it)."""
    half = cos.shape[-1] // 2
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    c, s = cos[..., :half].reshape(shape), sin[..., :half].reshape(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


@dataclass
class DsaCache:
    """One sequence's cache for one layer: the MLA latents and the indexer keys, per position."""

    k_latent: list[torch.Tensor] = field(default_factory=list)  # [t, kv_lora_rank]
    k_rope: list[torch.Tensor] = field(default_factory=list)  # [t, qk_rope_head_dim]
    index_k: list[torch.Tensor] = field(default_factory=list)  # [t, index_head_dim]

    @property
    def length(self) -> int:
        return sum(t.shape[0] for t in self.k_latent)

    def extend(self, name: str, t: torch.Tensor) -> torch.Tensor:
        getattr(self, name).append(t)
        return torch.cat(getattr(self, name))


class DsaIndexer:
    """The indexer: per query, a score for every key it may see."""

    def __init__(self, config, w: Mapping[str, torch.Tensor]):
        self.n_heads, self.head_dim, self.rope = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
        self.wq_b, self.wk = w["wq_b.weight"], w["wk.weight"]
        self.k_norm_w, self.k_norm_b = w["k_norm.weight"], w["k_norm.bias"]
        self.weights_proj = w["weights_proj.weight"]  # float32 in the release

    def keys(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        """x [S, H] -> the indexer keys [S, index_head_dim] (cached per position)."""
        k = F.layer_norm(F.linear(x, self.wk), (self.head_dim,), self.k_norm_w, self.k_norm_b, eps=1e-6)
        return torch.cat([rope_interleaved(k[:, : self.rope], cos, sin), k[:, self.rope :]], dim=-1)

    def queries(self, x: torch.Tensor, q_resid: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexer's queries float32 [S, h, D] (rotated) and head weights float32 [S, h]."""
        q = F.linear(q_resid, self.wq_b).view(x.shape[0], self.n_heads, self.head_dim)
        q = torch.cat([rope_interleaved(q[..., : self.rope], cos, sin), q[..., self.rope :]], dim=-1)
        w = F.linear(x.to(self.weights_proj.dtype), self.weights_proj).float() * self.n_heads**-0.5
        return q.float(), w

    def scores(self, x: torch.Tensor, q_resid: torch.Tensor, cos, sin, keys: torch.Tensor) -> torch.Tensor:
        """float32 [S, T]: sum over heads of weight_h(x) * relu(q_h . k / sqrt(D)), unmasked."""
        q, w = self.queries(x, q_resid, cos, sin)
        per_head = F.relu(torch.matmul(q, keys.t().float()) * self.head_dim**-0.5)  # [S, h, T]
        return torch.matmul(w.unsqueeze(-2), per_head).squeeze(-2)


def select(scores: torch.Tensor, q_pos: torch.Tensor, topk: int, threshold: int, sparse: bool) -> torch.Tensor:
    """Which keys each query attends to: bool [S, T].

    Query at position p sees keys 0..p. If ``sparse`` and it sees more than ``threshold`` keys
    (and more than ``topk``), only its ``topk`` best-scored visible keys (of equal scores, the
    earlier key); otherwise all visible."""
    s, t = scores.shape
    visible = torch.arange(t, device=scores.device)[None, :] <= q_pos[:, None]
    allowed = visible.clone()
    if not sparse:
        return allowed
    rows = ((q_pos + 1) > max(threshold, topk)).nonzero(as_tuple=True)[0]
    if rows.numel():
        masked = scores[rows].masked_fill(~visible[rows], float("-inf"))
        # a stable sort: equal scores (relu makes zeros) go to the earlier key, whatever the
        # batch shape, where topk's choice among ties is unspecified
        idx = masked.sort(dim=-1, descending=True, stable=True).indices[:, :topk]
        allowed[rows] = torch.zeros_like(allowed[rows]).scatter_(1, idx, True)
    return allowed


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float, chunk: int = 256
) -> torch.Tensor:
    """q [S, h, Dqk], k [T, h, Dqk], v [T, h, Dv], allowed bool [S, T] -> [S, h, Dv]; softmax in
    float32 over the allowed keys only; queries in chunks, so memory is chunk x T per head."""
    out = []
    for i in range(0, q.shape[0], chunk):
        qc, mc = q[i : i + chunk], allowed[i : i + chunk]
        logits = torch.einsum("shd,thd->hst", qc, k).float() * scale
        logits = logits.masked_fill(~mc[None], float("-inf"))
        p = torch.softmax(logits, dim=-1).to(v.dtype)
        out.append(torch.einsum("hst,thd->shd", p, v))
    return torch.cat(out)


class DsaAttention:
    """One glm_moe_dsa attention layer (MLA + DSA), for one sequence, with a cache.

    ``w``: the layer's ``self_attn.*`` tensors without the prefix. A layer whose indexer_types
    entry is "shared" has no indexer and reuses the previous full layer's selection."""

    def __init__(
        self, config, w: Mapping[str, torch.Tensor], layer: int, *, sparse: bool, threshold: int = DENSE_UNTIL_KEYS
    ):
        self.cfg, self.sparse, self.threshold = config, sparse, threshold
        if threshold < 0:
            raise ValueError(f"threshold {threshold} is negative")
        self.w = dict(w)
        self.h = config.num_attention_heads
        self.nope, self.rope, self.vdim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.kv_lora = config.kv_lora_rank
        self.scale = (self.nope + self.rope) ** -0.5
        if (config.rope_parameters or {}).get("rope_type", "default") != "default":
            raise NotImplementedError("the reference scales attention for the default RoPE only")
        self.shared = config.indexer_types[layer] == "shared"
        self.indexer = (
            None
            if self.shared
            else DsaIndexer(
                config, {k.removeprefix("indexer."): v for k, v in self.w.items() if k.startswith("indexer.")}
            )
        )

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: DsaCache, prev_allowed: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [S, hidden] at ``positions`` (continuing ``cache``) -> (output [S, hidden], the
        selection bool [S, T] that a following "shared" layer reuses)."""
        w, s = self.w, x.shape[0]
        if positions.numel() != s or int(positions[0]) != cache.length:
            raise ValueError(f"positions start at {int(positions[0])}; the cache holds {cache.length} keys")
        cos, sin = rope_cos_sin(self.cfg, positions, x.dtype)
        q_resid = rms_norm(F.linear(x, w["q_a_proj.weight"]), w["q_a_layernorm.weight"], 1e-6)
        q = F.linear(q_resid, w["q_b_proj.weight"]).view(s, self.h, self.nope + self.rope)
        q = torch.cat([q[..., : self.nope], rope_interleaved(q[..., self.nope :], cos, sin)], dim=-1)
        ckv = F.linear(x, w["kv_a_proj_with_mqa.weight"])
        latent = rms_norm(ckv[:, : self.kv_lora], w["kv_a_layernorm.weight"], 1e-6)
        k_rope = rope_interleaved(ckv[:, None, self.kv_lora :], cos, sin)[:, 0]
        latent, k_rope = cache.extend("k_latent", latent), cache.extend("k_rope", k_rope)
        t = latent.shape[0]
        kv = F.linear(latent, w["kv_b_proj.weight"]).view(t, self.h, self.nope + self.vdim)
        k = torch.cat([kv[..., : self.nope], k_rope[:, None, :].expand(t, self.h, self.rope)], dim=-1)
        v = kv[..., self.nope :]
        if self.indexer is not None:
            keys = cache.extend("index_k", self.indexer.keys(x, cos, sin))
            scores = self.indexer.scores(x, q_resid, cos, sin, keys)
            allowed = select(scores, positions, self.cfg.index_topk, self.threshold, self.sparse)
        elif prev_allowed is None:
            raise ValueError("a shared-indexer layer needs the previous full layer's selection")
        else:
            allowed = prev_allowed
        o = attend(q, k, v, allowed, self.scale).reshape(s, self.h * self.vdim)
        return F.linear(o, w["o_proj.weight"]), allowed
