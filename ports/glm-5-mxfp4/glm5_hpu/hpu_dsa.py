"""GLM_DSA_SPARSE=1 inside vllm-gaudi's MLA path: each query that sees more than the threshold
(32,768) keys attends to the ``index_topk`` (2,048) keys its DSA indexer scores highest, the rule
of glm5_hpu/dsa.py, applied as an attention bias to vllm-gaudi's own MLA attention.

vllm-gaudi (main 091bbad, ``attention/oot_mla.py``) runs DSA layers as dense MLA: the wrapper sets
``skip_topk`` so vLLM's indexer (CUDA kernels) never runs, and its indexer-key cache
(``DeepseekV32IndexerCache``) is neither ``Attention`` nor ``MLAAttention``, so the runner neither
profiles nor allocates it. What this module adds, plugin-side, per MLA layer that has an indexer:

* the indexer computed in PyTorch from the weights vLLM loaded into its ``Indexer`` (``wq_b``,
  the fused ``wk_weights_proj``, ``k_norm``), by glm5_hpu/dsa.py's ``DsaIndexer`` (interleaved
  RoPE, as transformers 5.23.0's ``GlmMoeDsaIndexer``: vLLM 0.27.0 would rotate the indexer
  half-split unless the config says ``indexer_rope_interleave``, which transformers' does not);
* an indexer-key buffer per layer with the MLA cache's rows (one key per slot, bf16) and the
  position of the token in each slot (ties of equal scores go to the earlier key, as dsa.py's
  ``select``), allocated right after the runner's ``initialize_kv_cache``, i.e. after vLLM's
  memory profiling, which does not count them (why the serving page caps utilisation at 0.86);
* at every step, the new tokens' keys written at their slots (prefill chunks and decode), the
  scores of each query against every key it sees (the context gathered by the step's block
  list), and the selection turned into the step's attention bias: prefill ``attn_bias``
  [B, 1, T, context + T], decode block bias [blocks, block_size]. vllm-gaudi's own attention then
  runs with it. A query that sees at most the threshold keeps the runner's bias as it is, so its
  row is computed exactly as the dense path computes it (decode: the other rows' masked slots
  are a large finite negative, not -inf, so a block with no selected key adds an exact 0 instead
  of NaN to the block sums).

A launch whose --max-model-len is at most the threshold never selects: nothing is installed and
the layers are vllm-gaudi's dense MLA unchanged. The MTP draft's layer is left dense (its drafts
are verified by the target). Layers whose indexer_types entry is "shared" (reusing the previous
layer's selection) are not built: check_launch refuses them.

Test-only: ``GLM_DSA_TEST_THRESHOLD=N`` replaces the 32,768 threshold, and is refused unless
``GLM_DSA_TEST=1`` is set too (the tiny test checkpoints cannot reach 32,768 keys). The top-k is
always the checkpoint's ``index_topk``, as transformers reads it.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .dsa import DENSE_UNTIL_KEYS, DsaIndexer, rope_cos_sin
from .switches import SwitchError

# a child of vLLM's "vllm" logger, whose handler vLLM configures: under our own name the lines
# never reached a server's log
logger = logging.getLogger(f"vllm.{__name__}")

TEST_FLAG = "GLM_DSA_TEST"
TEST_THRESHOLD = "GLM_DSA_TEST_THRESHOLD"
#: the bias of a key a sparse decode row does not select: finite, so a block of the flat layout
#: whose keys are all unselected gives exp(-1e30 - its max) = 0 against the row's maximum, not NaN
UNSELECTED = -1e30


def threshold(env: Mapping[str, str] | None = None) -> int:
    """Keys a query must see before the top-k applies: 32,768, or the test-only
    GLM_DSA_TEST_THRESHOLD when GLM_DSA_TEST=1 (SwitchError otherwise, naming both)."""
    env = os.environ if env is None else env
    raw = env.get(TEST_THRESHOLD)
    if raw is None:
        return DENSE_UNTIL_KEYS
    if env.get(TEST_FLAG) != "1":
        raise SwitchError(
            f"{TEST_THRESHOLD}={raw}: a test-only setting (it changes the model's attention); it is read only "
            f"with {TEST_FLAG}=1. Unset {TEST_THRESHOLD} to serve the model's threshold ({DENSE_UNTIL_KEYS})"
        )
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SwitchError(f"{TEST_THRESHOLD}={raw}: not a positive whole number of keys")
    return value


# ------------------------------------------------------------------ the selection (pure)
def choose(
    scores: torch.Tensor,
    key_pos: torch.Tensor,
    visible: torch.Tensor,
    q_pos: torch.Tensor,
    topk: int,
    threshold: int,
) -> torch.Tensor:
    """Which keys each query attends to, bool [R, L] (a subset of ``visible``).

    scores float [R, L], key_pos int [R, L] (the key's position in its sequence), visible bool
    [R, L] (the keys the query may see: its own sequence, causal), q_pos int [R]. A query that
    sees more than max(threshold, topk) keys (q_pos + 1) keeps its ``topk`` best-scored visible
    keys, of equal scores the earlier position (dsa.py ``select``); any other query keeps every
    visible key. The keys of a row may come in any order (vllm-gaudi's block lists are not in
    position order): ties are broken by position, not by column. No value is read back to the
    host."""
    sparse = (q_pos + 1) > max(threshold, topk)
    masked = scores.float().masked_fill(~visible, float("-inf"))
    far = torch.iinfo(torch.int64).max
    by_pos = key_pos.long().masked_fill(~visible, far).argsort(dim=-1, stable=True)
    order = masked.gather(-1, by_pos).argsort(dim=-1, descending=True, stable=True)
    best = by_pos.gather(-1, order[:, :topk])
    chosen = torch.zeros_like(visible).scatter_(-1, best, True) & visible
    return torch.where(sparse[:, None], chosen, visible)


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, head_dim: int) -> torch.Tensor:
    """float32 [..., L]: sum over heads of w_h * relu(q_h . k / sqrt(D)), as dsa.py ``DsaIndexer.scores``.

    q [..., h, D], w [..., h], keys [..., L, D] (the same leading dims)."""
    per_head = torch.relu(torch.matmul(q.float(), keys.float().transpose(-1, -2)) * head_dim**-0.5)  # [..., h, L]
    return torch.matmul(w.float().unsqueeze(-2), per_head).squeeze(-2)


#: bytes one query chunk of the prefill scoring may hold at once (per-head fp32 scores, the masked
#: copy and the int64 sort indices of ``choose``): unchunked, a 4,096-token chunk against 131,072
#: keys held ~128 GiB with GLM-5.3's 32 index heads (hpu_emulation.cost, ``dsa_scoring_peak``)
SCORE_BUDGET = 1 << 30


def row_bytes(heads: int, keys: int) -> int:
    """Bytes one query row's scoring holds: per key, two fp32 per-head score tensors at once (the
    product and its scaled copy, eager), the fp32 sum and its masked copy, three int64 index rows
    (``choose``'s position order, its score order and the gathered one)."""
    return keys * (8 * heads + 4 + 4 + 3 * 8)


def score_rows(heads: int, keys: int, budget: int = SCORE_BUDGET) -> int:
    """Query rows scored at once so that a chunk holds at most ``budget`` bytes."""
    return max(1, budget // row_bytes(heads, keys))


def prefill_bias(
    bias: torch.Tensor,
    q: torch.Tensor,
    w: torch.Tensor,
    keys,
    key_pos,
    q_pos,
    topk: int,
    threshold: int,
    head_dim: int,
    budget: int = SCORE_BUDGET,
) -> torch.Tensor:
    """The prefill attention bias [B, 1, T, L] with the selection applied.

    bias: the runner's [B, 1, T, L] (0 visible, -inf not: context padding, causal, length);
    q [B, T, h, D], w [B, T, h], keys [B, L, D], key_pos [B, L], q_pos [B, T]. The queries are
    scored and selected in chunks of :func:`score_rows` rows (each row's selection depends on
    its own scores only, so the chunks give the rows the unchunked pass gives)."""
    b, t = q_pos.shape
    length = bias.shape[-1]
    rows = score_rows(q.shape[-2], length, budget)
    out = torch.empty((b, t, length), dtype=bias.dtype, device=bias.device)
    k4 = keys.unsqueeze(1)
    for s in range(0, t, rows):
        e = min(t, s + rows)
        c = e - s
        chunk_bias = bias[:, 0, s:e]
        visible = ~torch.isneginf(chunk_bias)  # [B, c, L]
        scores = index_scores(q[:, s:e], w[:, s:e], k4, head_dim)  # [B, c, L]
        keep = choose(
            scores.reshape(b * c, -1),
            key_pos.unsqueeze(1).expand(b, c, -1).reshape(b * c, -1),
            visible.reshape(b * c, -1),
            q_pos[:, s:e].reshape(-1),
            topk,
            threshold,
        ).view(b, c, -1)
        # rows never go empty (a sparse row keeps topk keys), so -inf is safe here
        out[:, s:e] = torch.where(keep | ~visible, chunk_bias, float("-inf")).to(bias.dtype)
    return out.unsqueeze(1)


def decode_bias(
    bias: torch.Tensor,
    block_mapping: torch.Tensor,
    q: torch.Tensor,
    w: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    q_pos: torch.Tensor,
    topk: int,
    threshold: int,
    head_dim: int,
) -> torch.Tensor:
    """The decode block bias [NB, bs] of vllm-gaudi's flat layout with the selection applied.

    bias [NB, bs] (0 used, -inf unused slot), block_mapping [NB, B] (one-hot: the row a block
    belongs to; no row for padding blocks), q [B, h, D], w [B, h], keys [NB, bs, D] and key_pos
    [NB, bs] (the blocks' indexer keys and positions), q_pos [B]."""
    nb, bs = bias.shape
    rows = block_mapping.shape[1]
    own = block_mapping.t() > 0  # [B, NB]
    onehot = block_mapping.float()
    qb = (onehot @ q.float().reshape(rows, -1)).view(nb, *q.shape[1:])  # each block's row's query (exact: one-hot)
    wb = onehot @ w.float()
    scores = index_scores(qb, wb, keys, head_dim)  # [NB, bs]
    used = ~torch.isneginf(bias)
    visible = own[:, :, None] & used[None]  # [B, NB, bs]
    keep = choose(
        scores.reshape(1, -1).expand(rows, -1),
        key_pos.reshape(1, -1).expand(rows, -1),
        visible.reshape(rows, -1),
        q_pos,
        topk,
        threshold,
    ).view(rows, nb, bs)
    kept = (keep & own[:, :, None]).any(0) | ~own.any(0)[:, None]  # padding blocks as they were
    return torch.where(kept | ~used, bias, torch.full_like(bias, UNSELECTED))


# ------------------------------------------------------------------ the layers
_LAYERS: weakref.WeakSet[_LayerDsa] = weakref.WeakSet()


@dataclass(eq=False)
class _LayerDsa:
    """One MLA layer's DSA state: its indexer, its key buffers, and the step's inputs."""

    name: str
    indexer: DsaIndexer
    config: object
    topk: int
    threshold: int
    mla_attn: torch.nn.Module
    keys: torch.Tensor | None = None
    pos: torch.Tensor | None = None
    step: dict = field(default_factory=dict)

    def allocate(self) -> int:
        """The key buffers, with the rows of the layer's MLA cache as now bound; their bytes (0 when
        the layer has no cache)."""
        cache = getattr(self.mla_attn, "kv_cache", None)
        if isinstance(cache, list | tuple) and cache and isinstance(cache[0], list | tuple):
            cache = cache[0]  # one entry per virtual engine in some vLLM versions
        if not isinstance(cache, list | tuple) or len(cache) < 1 or cache[0] is None or cache[0].numel() == 0:
            return 0
        rows = cache[0].shape[0]
        keys = torch.zeros(rows, self.indexer.head_dim, dtype=cache[0].dtype, device=cache[0].device)
        pos = torch.zeros(rows, dtype=torch.int32, device=cache[0].device)
        self.keys, self.pos = keys, pos
        return keys.numel() * keys.element_size() + pos.numel() * pos.element_size()

    def bias(self, kv_cache, md):
        """The step's attention metadata with the selection applied (None: no buffers yet, the
        profile run and warm-up before the caches: the dense path)."""
        if self.keys is None or self.pos is None or kv_cache is None or len(kv_cache) < 2:
            return None
        keys_buf, pos_buf = self.keys, self.pos
        if kv_cache[0].shape[0] != keys_buf.shape[0]:
            raise RuntimeError(
                f"{self.name}: the MLA cache has {kv_cache[0].shape[0]} rows, the DSA key buffer "
                f"{keys_buf.shape[0]}: the cache was reallocated without the runner's initialize_kv_cache"
            )
        x, q_resid, positions = self.step.pop("x"), self.step.pop("q_resid"), self.step.pop("positions")
        # one row per token, whatever batch shape the runner gives the model
        x, q_resid, positions = (
            x.reshape(-1, x.shape[-1]),
            q_resid.reshape(-1, q_resid.shape[-1]),
            positions.reshape(-1),
        )
        cos, sin = rope_cos_sin(self.config, positions, x.dtype)
        new_keys = self.indexer.keys(x, cos, sin)
        q, w = self.indexer.queries(x, q_resid, cos, sin)
        slots = md.slot_mapping.flatten()
        keys_buf.index_copy_(0, slots, new_keys.to(keys_buf.dtype))
        pos_buf.index_copy_(0, slots, positions.to(pos_buf.dtype))
        bs, d = md.block_size, self.indexer.head_dim
        if md.is_prompt:
            b = md.seq_lens_tensor.shape[0]
            t = positions.shape[0] // b
            keys, key_pos = new_keys.view(b, t, d), positions.view(b, t)
            if md.block_list is not None:
                ctx = md.block_list.view(-1)
                ctx_keys = keys_buf.view(-1, bs, d).index_select(0, ctx).view(b, -1, d)
                ctx_pos = pos_buf.view(-1, bs).index_select(0, ctx).view(b, -1)
                keys, key_pos = torch.cat([ctx_keys, keys], 1), torch.cat([ctx_pos.to(key_pos.dtype), key_pos], 1)
            bias = md.attn_bias if md.attn_bias is not None else _causal_bias(md.seq_lens_tensor, t, x.dtype)
            bias = prefill_bias(
                bias,
                q.view(b, t, *q.shape[1:]),
                w.view(b, t, -1),
                keys,
                key_pos,
                positions.view(b, t),
                self.topk,
                self.threshold,
                d,
            )
        else:
            blocks = md.block_list.view(-1)
            bias = decode_bias(
                md.attn_bias,
                md.block_mapping,
                q,
                w,
                keys_buf.view(-1, bs, d).index_select(0, blocks),
                pos_buf.view(-1, bs).index_select(0, blocks),
                positions,
                self.topk,
                self.threshold,
                d,
            )
        return _replace(md, attn_bias=bias)


def _causal_bias(seq_lens: torch.Tensor, t: int, dtype) -> torch.Tensor:
    """[B, 1, T, T]: 0 where key j <= query i < the sequence's length's keys, else -inf: the mask the
    runner builds when it passes none (FusedSDPA's is_causal with valid lengths)."""
    cols = torch.arange(t, device=seq_lens.device)
    vis = (cols[None, :] <= cols[:, None])[None] & (cols[None, None, :] < seq_lens.view(-1, 1, 1))
    return torch.zeros(vis.shape, dtype=dtype, device=seq_lens.device).masked_fill_(~vis, float("-inf")).unsqueeze(1)


def _replace(md, **fields):
    """The runner's metadata is a named tuple (TrimmedAttentionMetadata) or a dataclass."""
    if hasattr(md, "_replace"):
        return md._replace(**fields)
    import dataclasses

    return dataclasses.replace(md, **fields)


def _indexer_weights(indexer) -> dict[str, torch.Tensor]:
    """dsa.py's names from vLLM's Indexer as loaded (wk and weights_proj are one fused weight)."""
    d = indexer.head_dim
    fused = indexer.wk_weights_proj.weight
    dtype = indexer.wq_b.weight.dtype
    return {
        "wq_b.weight": indexer.wq_b.weight,
        "wk.weight": fused[:d],
        "weights_proj.weight": fused[d:],
        "k_norm.weight": indexer.k_norm.weight.to(dtype),
        "k_norm.bias": indexer.k_norm.bias.to(dtype),
    }


def install(model: torch.nn.Module, config, threshold: int) -> int:
    """Make every MLA layer of ``model`` that has an indexer apply the DSA rule; returns how many.

    Run after the model is built (its indexer weights are read when a step runs, so after loading).
    Raises SwitchError where vllm-gaudi's configuration would drop the bias: merged prefill (one
    row of many prompts) and FusedSDPA slicing (which applies the mask to some chunks only)."""
    from vllm.model_executor.layers.mla import MultiHeadLatentAttentionWrapper
    from vllm_gaudi.extension.runtime import get_config

    gaudi = get_config()
    if gaudi.merged_prefill:
        raise SwitchError("GLM_DSA_SPARSE=1 above the threshold: not built with vllm-gaudi's merged prefill")
    if gaudi.enable_fsdpa_slicing:
        raise SwitchError(
            "GLM_DSA_SPARSE=1 above the threshold: vllm-gaudi's sliced FusedSDPA applies the attention mask "
            "to some chunks only, so the top-k would be lost; set VLLM_HPU_FSDPA_SLICE_ENABLED=false"
        )
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, MultiHeadLatentAttentionWrapper) or module.indexer is None:
            continue
        if not hasattr(module.mla_attn, "forward_impl") or not getattr(module.mla_attn, "use_direct_call", False):
            raise RuntimeError(f"{name}: not vllm-gaudi's HPU MLA layer (forward_impl called directly)")
        _install_layer(name, module, config, threshold)
        count += 1
    _hook_runner()
    return count


class _LazyIndexer(DsaIndexer):
    """dsa.py's indexer over vLLM's Indexer module: the weights are read at each call, so the
    loader's later copies into the parameters are the ones used."""

    def __init__(self, config, module):
        self.n_heads, self.head_dim, self.rope = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
        self._module = module

    def __getattr__(self, item):
        names = {"wq_b": "wq_b.weight", "wk": "wk.weight", "weights_proj": "weights_proj.weight"}
        names.update(k_norm_w="k_norm.weight", k_norm_b="k_norm.bias")
        if item in names:
            return _indexer_weights(self.__dict__["_module"])[names[item]]
        raise AttributeError(item)


def _install_layer(name: str, wrapper, config, threshold: int) -> None:
    state = _LayerDsa(
        name=name,
        indexer=_LazyIndexer(config, wrapper.indexer),
        config=config,
        topk=wrapper.indexer.topk_tokens,
        threshold=threshold,
        mla_attn=wrapper.mla_attn,
    )
    _LAYERS.add(state)
    wrapper._glm_dsa = state
    forward = wrapper.forward

    def dsa_forward(positions, hidden_states, llama_4_scaling=None):
        state.step.update(x=hidden_states, positions=positions)
        return forward(positions, hidden_states, llama_4_scaling)

    def keep_q_resid(_module, _args, out):
        state.step["q_resid"] = out

    wrapper.forward = dsa_forward
    wrapper.q_a_layernorm.register_forward_hook(keep_q_resid)
    forward_impl = wrapper.mla_attn.forward_impl

    def dsa_forward_impl(q, k_c_normed, k_pe, kv_cache, attn_metadata, *args, **kwargs):
        md = state.bias(kv_cache, attn_metadata)
        return forward_impl(q, k_c_normed, k_pe, kv_cache, attn_metadata if md is None else md, *args, **kwargs)

    wrapper.mla_attn.forward_impl = dsa_forward_impl


_hooked = False


def _hook_runner() -> None:
    """After vllm-gaudi's runner allocates the KV caches (after profiling), allocate the DSA key buffers."""
    global _hooked
    if _hooked:
        return
    from vllm_gaudi.v1.worker import hpu_model_runner

    runner = hpu_model_runner.HPUModelRunner
    initialize = runner.initialize_kv_cache

    def initialize_kv_cache(self, kv_cache_config) -> None:
        initialize(self, kv_cache_config)
        sizes = [s.allocate() for s in list(_LAYERS)]
        if any(sizes):
            logger.info(
                "glm5_hpu: DSA indexer-key buffers for %d layers, %.1f MiB",
                sum(1 for n in sizes if n),
                sum(sizes) / 2**20,
            )

    runner.initialize_kv_cache = initialize_kv_cache
    _hooked = True
