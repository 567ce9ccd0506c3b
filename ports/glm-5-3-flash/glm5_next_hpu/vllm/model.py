"""GLM-5.3-Flash for vLLM 0.26.0, built on the port's layers (``glm5_next_hpu.layers`` / ``kda`` / ``mhc``).

Registered lazily by ``glm5_next_hpu.vllm_plugin:register``. Structure:

* **KDA layers** (``Glm5NextKDA``): a ``MambaBase`` layer with its own state spec -- conv state
  (3*H*K channels x (kernel-1), model dtype) and an fp32 recurrent state (H, K, V), the shapes and
  dtypes of vLLM's ``kda_state_shape`` / ``kda_state_dtype`` -- on the GDN metadata builder
  (``MambaAttentionBackendEnum.GDN_ATTN``: query_start_loc, state indices, has_initial_state).
  The core runs the port's PyTorch kernels (``chunk_kda`` prefill, ``fused_recurrent_kda``
  decode) inside one custom op, reading and writing the engine's state slots with whole-tensor
  ``copy_``. The carry between prefill chunks is the GLM5_NEXT_KDA_SCAN switch, passed to
  ``chunk_kda`` as ``use_scan`` (unset: the scan on HPU, the sequential carry on CPU). It
  implements only the non-caching state contract, so the model refuses prefix caching.
  Parameter plumbing follows vLLM's Kimi KDA layer (separate q/k/v conv weights, ``A_log`` held
  as [1, 1, H/tp, 1] and reshaped from the flat checkpoint tensor *before* sharding, fp32
  ``dt_bias``) with GLM's bounded-sigmoid gate, not Kimi's softplus.
* **NoPE MLA layers** (``Glm5NextMLA``): selected by platform. On CPU (which refuses MLA) the
  *expanded* form: per-head keys and values from ``kv_b_proj`` of the normalised latent, vLLM's
  standard ``Attention`` with head size ``qk_nope_head_dim`` (256 on the real model), scale
  ``qk_nope_head_dim ** -0.5`` -- the same function as the latent form (there is no RoPE). On
  other platforms (HPU) vLLM's ``MultiHeadLatentAttentionWrapper`` with a fused q_a/kv_a
  projection, as the original port did. The DSA indexer is loaded but skipped (dense attention is
  the same function up to index_topk + index_kpool - 1 keys).
* **MoE / dense MLP / mHC**: the shared layers (fp32 sigmoid routing, bias for selection only,
  swiglu clamp on routed, shared and dense experts; mHC in the reference op order). The Sinkhorn
  switch: ``torch`` = the reference loop; ``kernel`` = the TPC op on HPU, and on CPU the same
  operation order emulated (``sinkhorn_tpc_order``).
* **Images** (``multimodal.py``, kept apart from the text model): the class is
  ``SupportsMultiModal`` and registers its processor with ``MULTIMODAL_REGISTRY``; the tower and
  merger run in ``embed_multimodal`` and vLLM's own ``embed_input_ids`` merges the embeddings at
  the placeholder positions. Video is refused; GLM5_NEXT_IMAGE_MAX_TOKENS resizes to fit.
* **Tensor / expert parallelism** (``parallel.py``): vLLM's column/row-parallel arithmetic on
  plain ``nn.Linear`` sized per rank, the all-reduce after each row-parallel block (KDA and MLA
  o_proj, dense MLP down_proj, MoE routed + shared once), the vocabulary split with a masked
  embedding lookup and all-gathered logits; KDA and MLA heads, the KDA conv weights, dt_bias,
  A_log and the per-rank KDA state (``kda_state_shape`` with the TP size) split by head; routed
  experts whole per rank with ``enable_expert_parallel``, else split on the intermediate dim.
  Router, mHC, norms and the (skipped) indexer are replicated.
* **Block FP8**: on CPU the reference config (``fp8_config.py``): layers in the model dtype, FP8
  weights dequantized at load. With vLLM's ``Fp8Config`` (HPU) the MLA projections, the dense MLP
  and the shared expert are built by ``parallel.make_linear`` as vLLM linear layers with the
  config's method (``Fp8LinearMethod``: e4m3 weights and block scales, loaded as they are); the
  KDA projections (BF16 in the release), the HPU path's fused q_a/kv_a projection and the indexer
  stay in the model dtype, their FP8 weights dequantized. On both paths the routed experts (the
  port's loop: the SwiGLU clamp) hold the FP8 bytes and block scales, dequantized per chunk;
  GLM5_NEXT_MOE_OP=fused (HPU only) puts them on vllm-gaudi's fused FP8 MoE op (no clamp).
* ``is_hybrid`` / ``has_inner_state`` set: without ``is_hybrid`` vLLM allocates no mamba state
  and every KDA layer is silently skipped; the mamba-state classmethods describe the KDA state.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateCopyFuncCalculator,
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
    is_conv_state_dim_first,
)
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.platforms import current_platform
from vllm.sequence import IntermediateTensors
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from .. import mhc as port_mhc
from ..config import UnsupportedConfigError, check_mla, validate_config
from ..kda import causal_conv1d, chunk_kda, fused_recurrent_kda, gated_rms_norm, kda_gate
from ..layers.mhc import MhcLayer, add_mhc_parameters
from ..layers.mla import Indexer
from ..layers.norm import RMSNorm
from ..layers.vision import VisionModel
from ..switches import read_switches
from .fp8_config import checkpoint_fp8_spec, layer_quant_config
from .loader import load_checkpoint, mark
from .multimodal import (
    Glm5NextDummyInputsBuilder,
    Glm5NextImageModelMixin,
    Glm5NextMultiModalProcessor,
    Glm5NextProcessingInfo,
)
from .parallel import (
    ColumnLinear,
    LMHead,
    Parallel,
    RowLinear,
    VocabEmbedding,
    decoder_mlp,
    divide,
    from_vllm,
    make_linear,
)

logger = logging.getLogger(__name__)

#: head sizes vLLM 0.26.0's CPU attention backend accepts; the expanded MLA needs one of them
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _text_config(vllm_config: VllmConfig):
    return vllm_config.model_config.hf_text_config


def _shard(param: nn.Parameter, dim: int | None, view: tuple[int, ...] | None = None) -> nn.Parameter:
    if view is not None:
        mark(param, glm5_view=view)
    return mark(param, glm5_shard_dim=dim)


# ============================================================================ KDA


def glm5_next_kda_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    core_out: torch.Tensor,
    layer_name: str,
) -> None:
    layer = get_forward_context().no_compile_layers[layer_name]
    layer._core(q, k, v, g, beta, core_out)


def glm5_next_kda_core_fake(q, k, v, g, beta, core_out, layer_name) -> None:
    return


direct_register_custom_op(
    op_name="glm5_next_kda_core",
    op_func=glm5_next_kda_core,
    mutates_args=["core_out"],
    fake_impl=glm5_next_kda_core_fake,
)


class Glm5NextKDA(nn.Module, MambaBase):
    """KDA linear attention with GLM's bounded gate, on the engine's mamba state slots.

    ``use_scan`` (the GLM5_NEXT_KDA_SCAN switch) is handed to ``chunk_kda``: True the
    Hillis-Steele carry, False the sequential one, None the kernel's device default."""

    def __init__(
        self, config, vllm_config: VllmConfig, prefix: str, use_scan: bool | None = None, par: Parallel | None = None
    ):
        super().__init__()
        self.prefix = prefix
        self.use_scan = use_scan
        par = par or Parallel()
        self.tp_size = par.size
        D, H_all, K = config.hidden_size, config.linear_num_heads, config.linear_head_dim
        # vLLM's Kimi KDA split: heads over TP ranks (q/k/v/f_b/g_b/b column-parallel, the three
        # conv weights, dt_bias and A_log by head, o_proj row-parallel); f_a/g_a and o_norm replicated.
        H = divide(H_all, par.size, "linear_num_heads")
        self.num_heads, self.head_dim, self.conv_size = H, K, config.linear_conv_kernel_dim
        self.total_heads = H_all
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.q_proj = ColumnLinear(D, H_all * K, par, "linear_num_heads * linear_head_dim")
        self.k_proj = ColumnLinear(D, H_all * K, par, "linear_num_heads * linear_head_dim")
        self.v_proj = ColumnLinear(D, H_all * K, par, "linear_num_heads * linear_head_dim")
        # vLLM Kimi layout: [H*K/tp, 1, W], fp32.
        self.q_conv1d = _Weight(torch.empty(H * K, 1, self.conv_size, dtype=torch.float32), 0)
        self.k_conv1d = _Weight(torch.empty(H * K, 1, self.conv_size, dtype=torch.float32), 0)
        self.v_conv1d = _Weight(torch.empty(H * K, 1, self.conv_size, dtype=torch.float32), 0)
        self.f_a_proj = nn.Linear(D, K, bias=False)
        self.f_b_proj = ColumnLinear(K, H_all * K, par, "linear_num_heads * linear_head_dim")
        self.dt_bias = _shard(nn.Parameter(torch.empty(H * K, dtype=torch.float32), requires_grad=False), 0)
        # Flat [H] on disk; held as [1, 1, H/tp, 1] (vLLM's Kimi layout) -> reshape, then shard dim 2.
        self.A_log = _shard(
            nn.Parameter(torch.empty(1, 1, H, 1, dtype=torch.float32), requires_grad=False), 2, (1, 1, -1, 1)
        )
        self.b_proj = ColumnLinear(D, H_all, par, "linear_num_heads")
        self.g_a_proj = nn.Linear(D, K, bias=False)
        self.g_b_proj = ColumnLinear(K, H_all * K, par, "linear_num_heads * linear_head_dim")
        self.o_norm = RMSNorm(K, config.rms_norm_eps)
        self.o_proj = RowLinear(H_all * K, D, par, "linear_num_heads * linear_head_dim")
        self.lower_bound = config.linear_lower_bound
        self.kv_cache = (torch.tensor([]), torch.tensor([]))
        ctx = vllm_config.compilation_config.static_forward_context
        if prefix in ctx:
            raise ValueError(f"Duplicate layer name: {prefix}")
        ctx[prefix] = self
        self.calls = 0  # KDA core calls with real tokens: the end-to-end test checks the layers ran
        # vllm-gaudi's hybrid cache: the runner sets this layer's KV cache group (a long tensor) after
        # laying out the cache (its GDN contract; the port's kda-cache-group patch extends it to this
        # model). The layer picks its row of the 2-D state index tensors with it.
        self.cache_group_idx = None

    # --- MambaBase state contract
    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.GDN_ATTN

    def get_state_shape(self):
        return MambaStateShapeCalculator.kda_state_shape(
            self.tp_size, self.total_heads, self.head_dim, conv_kernel_size=self.conv_size
        )

    def get_state_dtype(self):
        return MambaStateDtypeCalculator.kda_state_dtype(self.model_config.dtype, self.cache_config.mamba_cache_dtype)

    # --- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> [T, D]."""
        T = x.shape[0]
        H, K = self.num_heads, self.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        g = kda_gate(self.f_b_proj(self.f_a_proj(x)), self.A_log.view(-1), self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(self.b_proj(x).float())
        core = torch.zeros(T, H, K, dtype=x.dtype, device=x.device)
        if current_platform.is_cpu():
            torch.ops.vllm.glm5_next_kda_core(q, k, v, g.reshape(T, H * K), beta, core, self.prefix)
        else:
            # vllm-gaudi drives its own GDN layer directly, not through vLLM's custom op (which only
            # serves torch.compile's graph on CPU/GPU); the KDA core follows it.
            self._core(q, k, v, g.reshape(T, H * K), beta, core)
        gate = self.g_b_proj(self.g_a_proj(x)).view(T, H, K)
        o = gated_rms_norm(core, gate, self.o_norm.weight, self.o_norm.eps)
        return self.o_proj(o.to(x.dtype).reshape(T, H * K))

    def _conv_weight(self) -> torch.Tensor:
        return torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], dim=0).squeeze(1)

    def _core(self, q, k, v, g, beta, core_out) -> None:
        md_all = get_forward_context().attn_metadata
        if md_all is None:
            return  # profile run
        if not isinstance(md_all, dict):
            # vllm-gaudi passes one metadata object for every layer (its own contract), vLLM a dict
            # of per-layer metadata.
            self._core_hpu(md_all, q, k, v, g, beta, core_out)
            return
        md = md_all[self.prefix]
        n_tok = md.num_actual_tokens
        if n_tok == 0:
            return
        if md.num_spec_decodes:
            raise NotImplementedError("speculative decoding is not supported by the GLM-5.3-Flash KDA layer")
        H, K = self.num_heads, self.head_dim
        conv_cache, rec_cache = self.kv_cache
        qsl = md.non_spec_query_start_loc.tolist()
        slots = md.non_spec_state_indices_tensor.tolist()
        n_seq = md.num_decodes + md.num_prefills
        has_init = md.has_initial_state.tolist() if md.has_initial_state is not None else [True] * n_seq
        weight = self._conv_weight()
        qkv_all = torch.cat([q, k, v], dim=-1)[:n_tok]  # [T, 3HK]
        for i in range(n_seq):
            s, e, slot = qsl[i], qsl[i + 1], slots[i]
            if e == s:
                continue
            L = e - s
            init = bool(has_init[i])
            # Conv state slot: SD layout (W-1, C) or DS layout (C, W-1); the port wants [1, C, W-1].
            cs = conv_cache[slot] if is_conv_state_dim_first() else conv_cache[slot].transpose(0, 1)
            state = cs.unsqueeze(0) if init else None
            out, new_state = causal_conv1d(qkv_all[s:e].t().unsqueeze(0), weight, state)
            cs.copy_(new_state[0].to(cs.dtype))
            qq, kk, vv = out[0].t().reshape(L, 3, H, K).unsqueeze(0).unbind(2)
            gg = g[s:e].view(1, L, H, K)
            bb = beta[s:e].view(1, L, H)
            S0 = rec_cache[slot].unsqueeze(0) if init else None
            kw: dict[str, Any] = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
            if init and L == 1:
                o, S = fused_recurrent_kda(qq, kk, vv, gg, bb, **kw)
            else:
                o, S = chunk_kda(qq, kk, vv, gg, bb, **kw, use_scan=self.use_scan)
            assert S is not None  # output_final_state=True
            rec_cache[slot].copy_(S[0].to(rec_cache.dtype))
            core_out[s:e] = o[0].to(core_out.dtype)
        self.calls += 1

    def _state_rows(self, indices: torch.Tensor | None, n: int) -> torch.Tensor:
        """This layer's state slots from vllm-gaudi's index tensor (2-D: one row per KV cache group).

        Padded requests carry -1; like vllm-gaudi's own GDN layer, the index wraps to the cache's
        spare last row explicitly instead of relying on the device's negative-index semantics."""
        if indices is None:
            raise RuntimeError(f"{self.prefix}: vllm-gaudi gave no state indices for a KDA layer")
        if indices.dim() > 1:
            if self.cache_group_idx is None:
                raise RuntimeError(
                    f"{self.prefix}: the runner set no cache_group_idx on this KDA layer (is the port's "
                    "kda-cache-group patch applied?)"
                )
            indices = indices.index_select(0, self.cache_group_idx.view(1).to(indices.device)).squeeze(0)
        return torch.remainder(indices.long(), n)

    def _conv_rows(self, conv_cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[B, C, W-1] whatever the cache layout (DS: (C, W-1) per slot; SD: (W-1, C))."""
        states = conv_cache.index_select(0, rows)
        return states if is_conv_state_dim_first() else states.transpose(1, 2)

    def _store_conv(self, conv_cache: torch.Tensor, rows: torch.Tensor, states: torch.Tensor) -> None:
        states = states if is_conv_state_dim_first() else states.transpose(1, 2)
        conv_cache.index_copy_(0, rows, states.to(conv_cache.dtype).contiguous())

    def _core_hpu(self, md, q, k, v, g, beta, core_out) -> None:
        """vllm-gaudi's linear-attention contract, with static shapes and no host synchronisation.

        Prefill: ``B`` requests padded to one length ``L`` (tokens ``[B*L]``, right padding),
        ``padding_mask_flat`` marks real tokens, ``load_indices_tensor`` / ``store_indices_tensor``
        one state slot per request, ``has_initial_states_p`` whether a request continues an earlier
        chunk. Decode: one token per request, the same indices. Padded positions are masked
        (identity steps), so each request's final state is the one after its last real token."""
        H, K = self.num_heads, self.head_dim
        conv_cache, rec_cache = self.kv_cache
        n_slots = rec_cache.shape[0]
        load = self._state_rows(md.load_indices_tensor, n_slots)
        store_indices = getattr(md, "store_indices_tensor", None)
        store = self._state_rows(store_indices, n_slots) if store_indices is not None else load
        B = load.shape[0]
        T = q.shape[0]
        L = T // B
        weight = self._conv_weight()
        qkv = torch.cat([q, k, v], dim=-1).view(B, L, -1)  # [B, L, 3HK]
        W1 = self.conv_size - 1
        conv_state = self._conv_rows(conv_cache, load)  # [B, C, W-1]
        S0 = rec_cache.index_select(0, load)  # [B, H, K, V]
        if md.is_prompt:
            mask = md.padding_mask_flat.view(B, L) > 0
            init = md.has_initial_states_p
            if init is not None:
                keep = init.view(B).to(S0.dtype)
                conv_state = conv_state * keep.view(B, 1, 1).to(conv_state.dtype)
                S0 = S0 * keep.view(B, 1, 1, 1)
            out, _ = causal_conv1d(qkv.transpose(1, 2), weight, conv_state)
            # The new conv state: the last W-1 inputs before each request's padding.
            full = torch.cat([conv_state.to(qkv.dtype), qkv.transpose(1, 2)], dim=-1)  # [B, C, W-1+L]
            real = mask.sum(dim=1)  # [B]
            cols = real.view(B, 1, 1) + torch.arange(W1, device=full.device).view(1, 1, W1)
            new_conv = torch.gather(full, 2, cols.expand(B, full.shape[1], W1))
        else:
            mask = None
            out, new_conv = causal_conv1d(qkv.transpose(1, 2), weight, conv_state)
        qq, kk, vv = out.transpose(1, 2).reshape(B, L, 3, H, K).unbind(2)
        gg = g.view(B, L, H, K)
        bb = beta.view(B, L, H)
        kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True, mask=mask)
        if md.is_prompt:
            o, S = chunk_kda(qq, kk, vv, gg, bb, **kw, use_scan=self.use_scan)
        else:
            o, S = fused_recurrent_kda(qq, kk, vv, gg, bb, **kw)
        self._store_conv(conv_cache, store, new_conv)
        assert S is not None  # output_final_state=True
        rec_cache.index_copy_(0, store, S.to(rec_cache.dtype))
        core_out.copy_(o.reshape(T, H, K).to(core_out.dtype))
        self.calls += 1


class _Weight(nn.Module):
    """A bare ``weight`` parameter (the conv weights, held in vLLM's Kimi layout [H*K, 1, W])."""

    def __init__(self, t: torch.Tensor, shard_dim: int | None):
        super().__init__()
        self.weight = _shard(nn.Parameter(t, requires_grad=False), shard_dim)


# ============================================================================ MLA


class Glm5NextMLA(nn.Module):
    """NoPE MLA. CPU: expanded per-head K/V + vLLM Attention. Elsewhere: vLLM's MLA wrapper."""

    def __init__(self, config, vllm_config: VllmConfig, prefix: str, par: Parallel | None = None):
        super().__init__()
        par = par or Parallel()
        D, H_all = config.hidden_size, config.num_attention_heads
        # DeepSeek-V2's split: q_b / kv_b column-parallel by head, o_proj row-parallel; the low-rank
        # a-projections, their norms and the (skipped) indexer replicated.
        H = divide(H_all, par.size, "num_attention_heads")
        self.num_heads, self.nope, self.v_dim = H, config.qk_nope_head_dim, config.v_head_dim
        self.q_lora_rank, self.kv_lora_rank = config.q_lora_rank, config.kv_lora_rank
        self.expanded = current_platform.is_cpu()
        bias = config.attention_bias
        quant = layer_quant_config(vllm_config.quant_config)  # vLLM's Fp8Config, or None (see fp8_config)
        # The checkpoint has no KV-cache scales: vLLM's FP8 KV-cache method stays off the attention.
        attn_quant = vllm_config.quant_config if quant is None else None
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = make_linear(
            "column",
            config.q_lora_rank,
            H_all * self.nope,
            par,
            "num_attention_heads * qk_nope_head_dim",
            quant_config=quant,
            prefix=f"{prefix}.q_b_proj",
        )
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, config.rms_norm_eps)
        self.kv_b_proj = make_linear(
            "column",
            config.kv_lora_rank,
            H_all * (self.nope + self.v_dim),
            par,
            "num_attention_heads * (qk_nope_head_dim + v_head_dim)",
            quant_config=quant,
            prefix=f"{prefix}.kv_b_proj",
        )
        self.o_proj = make_linear(
            "row",
            H_all * self.v_dim,
            D,
            par,
            "num_attention_heads * v_head_dim",
            bias=bias,
            quant_config=quant,
            prefix=f"{prefix}.o_proj",
        )
        self.indexer = Indexer(config)  # loaded, skipped (dense == DSA up to index_topk + kpool - 1 keys)
        if self.expanded:
            if self.nope not in CPU_ATTENTION_HEAD_SIZES:
                raise UnsupportedConfigError(
                    f"qk_nope_head_dim {self.nope} is not a head size vLLM's CPU attention accepts {CPU_ATTENTION_HEAD_SIZES}"
                )
            if self.v_dim != self.nope:
                raise UnsupportedConfigError(
                    f"expanded MLA needs v_head_dim == qk_nope_head_dim, got {self.v_dim} / {self.nope}"
                )
            self.q_a_proj = make_linear(
                "replicated",
                D,
                config.q_lora_rank,
                par,
                "q_lora_rank",
                bias=bias,
                quant_config=quant,
                prefix=f"{prefix}.q_a_proj",
            )
            self.kv_a_proj_with_mqa = make_linear(
                "replicated",
                D,
                config.kv_lora_rank,
                par,
                "kv_lora_rank",
                bias=bias,
                quant_config=quant,
                prefix=f"{prefix}.kv_a_proj_with_mqa",
            )
            self.attn = Attention(
                num_heads=H,  # this rank's heads
                head_size=self.nope,
                scale=self.nope**-0.5,
                num_kv_heads=H,
                cache_config=vllm_config.cache_config,
                quant_config=attn_quant,
                prefix=f"{prefix}.attn",
            )
        else:  # HPU: the latent (MLA) cache through vLLM's wrapper. Not exercised on CPU.
            from vllm.model_executor.layers.mla import MLAModules, MultiHeadLatentAttentionWrapper

            # The fused q_a/kv_a projection stays in the model dtype (an FP8 checkpoint's two weights are
            # dequantized into it at load): loading two weights and two scales into one FP8 parameter
            # pair (the second half's block rows offset) is not built.
            self.fused_qkv_a_proj = _FusedQkvA(D, config.q_lora_rank, config.kv_lora_rank)
            modules = MLAModules(
                kv_a_layernorm=self.kv_a_layernorm,
                kv_b_proj=_TupleOut(self.kv_b_proj),
                rotary_emb=None,
                o_proj=_TupleOut(self.o_proj),
                fused_qkv_a_proj=self.fused_qkv_a_proj,
                kv_a_proj_with_mqa=None,
                q_a_layernorm=self.q_a_layernorm,
                q_b_proj=_TupleOut(self.q_b_proj),
                q_proj=None,
                indexer=None,
                is_sparse=False,
                topk_indices_buffer=None,
            )
            self.mla_attn = MultiHeadLatentAttentionWrapper(  # H: this rank's heads, as DeepSeek-V2 passes
                D,
                H,
                self.nope**-0.5,
                self.nope,
                0,
                self.v_dim,
                config.q_lora_rank,
                config.kv_lora_rank,
                modules,
                vllm_config.cache_config,
                attn_quant,
                prefix,
            )

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if not self.expanded:
            return self.mla_attn(positions, x)
        T = x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        c = self.kv_a_layernorm(self.kv_a_proj_with_mqa(x))
        kv = self.kv_b_proj(c).view(T, self.num_heads, self.nope + self.v_dim)
        k, v = kv.split([self.nope, self.v_dim], dim=-1)
        out = self.attn(q, k.reshape(T, -1), v.reshape(T, -1))
        return self.o_proj(out.view(T, -1))


class _FusedQkvA(nn.Module):
    """q_a_proj and kv_a_proj_with_mqa in one GEMM (rows: q_lora | kv_lora), as vLLM's MLA wrapper wants."""

    def __init__(self, D: int, q_lora: int, kv_lora: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(q_lora + kv_lora, D), requires_grad=False)
        mark(self.weight, glm5_fused={"q_a_proj.weight": (0, q_lora), "kv_a_proj_with_mqa.weight": (q_lora, kv_lora)})

    def forward(self, x):
        return F.linear(x, self.weight), None


class _TupleOut:
    """A projection as vLLM's MLA code calls it: ``proj(x) -> (y, bias)``, and its ``weight`` and
    ``quant_method`` read through (``get_and_maybe_dequant_weights`` on ``kv_b_proj`` after load).

    Not an ``nn.Module`` on purpose: as a module it would be a second owner of the projection, and
    vllm-gaudi's ``hpu_process_weights_after_loading``, which visits every module, would process
    the same weights twice (the FP8 block scales fail the second time)."""

    def __init__(self, inner: nn.Module):
        self.inner = inner

    def __getattr__(self, name):
        if name == "quant_method":
            return getattr(self.inner, "quant_method", None)
        return getattr(self.inner, name)

    def __call__(self, x):
        return self.inner(x), None


# ============================================================================ decoder


class Glm5NextDecoderLayer(MhcLayer):
    def __init__(self, config, vllm_config: VllmConfig, layer_idx: int, prefix: str, switches, par: Parallel):
        super().__init__()
        self.is_kda = config.layer_types[layer_idx] == "linear_attention"
        attn_prefix = f"{prefix}.self_attn"
        self.self_attn: Glm5NextKDA | Glm5NextMLA
        if self.is_kda:
            self.self_attn = Glm5NextKDA(config, vllm_config, attn_prefix, use_scan=switches.kda_scan, par=par)
        else:
            self.self_attn = Glm5NextMLA(config, vllm_config, attn_prefix, par=par)
        quant = vllm_config.quant_config
        self.mlp = decoder_mlp(
            config,
            layer_idx,
            par,
            layer_quant_config(quant),
            f"{prefix}.mlp",
            fp8_spec=checkpoint_fp8_spec(quant),
            moe_op=switches.moe_op,
            # the card's expert form wherever the platform is not vLLM's CPU one (as the MLA form
            # above), whatever device the activations sit on
            static_experts=not current_platform.is_cpu(),
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        add_mhc_parameters(self, config, requires_grad=False)
        self.hc_args = dict(
            rms_eps=config.rms_norm_eps,
            hc_eps=config.hc_eps,
            iters=config.hc_sinkhorn_iters,
            tpc_order=switches.mhc_sinkhorn == "kernel",
        )
        self.layer_idx, self.num_layers = layer_idx, config.num_hidden_layers
        self.decode_layer_group = min(switches.decode_layer_group, config.num_hidden_layers)

    @property
    def hpu_mark_step(self) -> bool:
        """Whether vllm-gaudi's per-layer hook ends a lazy-mode graph after this layer (read by the
        port's decode-layer-group patch at each forward): always in prefill, whose long chunks stay
        cut per layer; in decode after every ``decode_layer_group``-th layer and after the last
        (GLM5_NEXT_DECODE_LAYER_GROUP=45: one graph per decode step)."""
        try:
            md = get_forward_context().attn_metadata
        except AssertionError:  # no forward context: outside the runner's step
            return True
        if md is None or isinstance(md, dict) or getattr(md, "is_prompt", True):
            return True
        last = self.layer_idx + 1
        return last % self.decode_layer_group == 0 or last == self.num_layers

    def forward(self, positions: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """X [1, T, N, D] streams."""
        post, comb, x = port_mhc.hc_pre(X, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, **self.hc_args)
        h = self.input_layernorm(x)[0]
        y = self.self_attn(h) if self.is_kda else self.self_attn(positions, h)
        X = port_mhc.hc_post(y[None], X, post, comb)
        post, comb, x = port_mhc.hc_pre(X, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, **self.hc_args)
        return port_mhc.hc_post(self.mlp(self.post_attention_layernorm(x)), X, post, comb)


class Glm5NextTextModel(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str, switches, par: Parallel):
        super().__init__()
        self.config = config
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, par)
        self.layers = nn.ModuleList(
            Glm5NextDecoderLayer(config, vllm_config, i, f"{prefix}.layers.{i}", switches, par)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        X = embeds.unsqueeze(0).unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1).contiguous()
        for layer in self.layers:
            X = layer(positions, X)
        return self.norm(port_mhc.hc_head(X))[0]


def _check_checkpoint_config(vllm_config: VllmConfig, text, prefix_caching: bool):
    """The vendored schema against the checkpoint's config.json, field by field, and against the
    config vLLM parsed (transformers). Local checkpoints only; a hub id is logged and skipped."""
    from pathlib import Path

    from .hf_config import TEXT_FIELDS, ConfigCheckError, check_config_json

    path = Path(str(vllm_config.model_config.model)) / "config.json"
    if not path.is_file():
        logger.info("glm5_next_hpu: %s not on local disk; config.json schema check skipped", path)
        return None
    checked, report = check_config_json(
        path, tp_size=vllm_config.parallel_config.tensor_parallel_size, prefix_caching=prefix_caching
    )
    differ = [
        f"{name}: config.json {getattr(checked, name)!r} != parsed {getattr(text, name, None)!r}"
        for name in TEXT_FIELDS
        if getattr(text, name, None) != getattr(checked, name)
    ]
    if differ:
        raise ConfigCheckError(
            "the vendored reading of config.json differs from vLLM's parsed config:\n  - " + "\n  - ".join(differ)
        )
    return report


class _Container(nn.Module):
    """Gives the checkpoint's names: ``model.language_model.*``, ``model.visual.*``."""

    language_model: Glm5NextTextModel
    visual: VisionModel


@MULTIMODAL_REGISTRY.register_processor(
    Glm5NextMultiModalProcessor, info=Glm5NextProcessingInfo, dummy_inputs=Glm5NextDummyInputsBuilder
)
class Glm5NextForConditionalGeneration(nn.Module, Glm5NextImageModelMixin, HasInnerState, IsHybrid):
    """GLM-5.3-Flash for vLLM 0.26.0: text and images (the image side, ``Glm5NextImageModelMixin``
    and the registered processor, is in ``multimodal.py``; GLM5_NEXT_VISION=0 builds no tower)."""

    is_hybrid = True
    has_inner_state = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        hf = vllm_config.model_config.hf_config
        text = _text_config(vllm_config)
        self.switches = read_switches()
        cache = vllm_config.cache_config
        prefix_caching = bool(getattr(cache, "enable_prefix_caching", False))
        # Refuse prefix caching (and anything else the port cannot serve) at construction.
        self.par = from_vllm(vllm_config)
        validate_config(
            text, tp_size=self.par.size, prefix_caching=prefix_caching, expert_parallel=self.par.expert_parallel
        )
        # Off CPU the MLA layers are vLLM's latent MLA: refused here unless vLLM runs the model as MLA.
        check_mla(current_platform, vllm_config.model_config)
        self.config_report = _check_checkpoint_config(vllm_config, text, prefix_caching)
        # Block FP8: the reference path's spec (CPU) or vLLM's Fp8Config's (HPU); see fp8_config.
        self.fp8_spec = checkpoint_fp8_spec(vllm_config.quant_config)
        # The routed experts' path: fused (vllm-gaudi's FP8 MoE op) needs HPU and a block-FP8
        # checkpoint and is refused elsewhere; auto (unset) takes it where it can run, else exact.
        from .fused_moe import PATHS, resolve

        moe_op = resolve(self.switches.moe_op, current_platform, vllm_config.quant_config)
        self.switches = dataclasses.replace(self.switches, moe_op=moe_op)
        logger.info("glm5_next_hpu: routed experts on %s (GLM5_NEXT_MOE_OP resolved to %s)", PATHS[moe_op], moe_op)
        if self.switches.mhc_sinkhorn == "kernel" and current_platform.is_cpu():
            logger.info("GLM5_NEXT_MHC_SINKHORN=kernel on CPU: the TPC kernel's operation order, emulated in PyTorch")
        self.config = hf
        self.text_config = text
        self.model = _Container()
        self.model.language_model = Glm5NextTextModel(
            text, vllm_config, "model.language_model", self.switches, self.par
        )
        vision_cfg = getattr(hf, "vision_config", None)
        if self.switches.vision and vision_cfg is not None:
            self.model.visual = VisionModel(vision_cfg)
        self.lm_head = LMHead(text.vocab_size, text.hidden_size, self.par)

    # --- vLLM model interface (embed_input_ids: SupportsMultiModal's, which merges image embeddings)
    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        # vllm-gaudi passes [batch, padded_len] ids and positions (its flatten_input is off for this
        # model); the model works on vLLM's flat [tokens] layout. The runner reads the hidden states
        # back as [tokens, hidden] either way.
        if positions.dim() > 1:
            positions = positions.reshape(-1)
            if input_ids is not None:
                input_ids = input_ids.reshape(-1)
            if inputs_embeds is not None:
                inputs_embeds = inputs_embeds.reshape(-1, inputs_embeds.shape[-1])
        embeds = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        return self.model.language_model(positions, embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        vision = hasattr(self.model, "visual")
        report = load_checkpoint(
            self,
            weights,
            self.text_config.num_hidden_layers,
            tp_rank=self.par.rank,
            tp_size=self.par.size,
            skip=None if vision else (lambda key: key.startswith("model.visual.")),
            fp8=self.fp8_spec,
        )
        self.load_report = report
        return report.loaded_params

    # --- hybrid (mamba) state description, per the KDA layer
    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        return MambaStateDtypeCalculator.kda_state_dtype(
            vllm_config.model_config.dtype, vllm_config.cache_config.mamba_cache_dtype
        )

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        t = _text_config(vllm_config)
        return MambaStateShapeCalculator.kda_state_shape(
            vllm_config.parallel_config.tensor_parallel_size,
            t.linear_num_heads,
            t.linear_head_dim,
            conv_kernel_size=t.linear_conv_kernel_dim,
        )

    @classmethod
    def get_mamba_state_copy_func(cls):
        return MambaStateCopyFuncCalculator.kda_state_copy_func()

    def kda_calls(self) -> int:
        layers = self.model.language_model.layers
        return sum(layer.self_attn.calls for layer in layers if isinstance(layer.self_attn, Glm5NextKDA))
