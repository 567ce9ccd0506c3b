"""What one op costs on a Gaudi card, from its arguments' shapes and dtypes alone.

Each op gets an engine: the matrix engine (MME) for what Synapse lowers to matrix multiplication
(``mm``, ``bmm``, ``addmm``, ``baddbmm``, convolutions that are not depthwise, and the fused ops
built on it: ``hpu::sdpa_recomp_fwd``, ``hpu::mixture_of_experts.*``, ``hpu::fp8_gemm_v2``), the
vector cores (TPC) for everything else, or none for views and metadata (no kernel). FLOPs count a
multiply-add as two; a pointwise op one per output element; a reduction one per input element.
Bytes are what the op reads and writes in HBM: each input's distinct elements (a broadcast view is
read once) and each output, at their dtypes.

Two fused ops need the routing, which their arguments do not carry:
``hpu::mixture_of_experts`` reads only the experts its tokens are routed to, and the card that
holds the most of them sets the layer's time (every card waits at the all-reduce that follows).
:func:`busiest_card_hits` gives that card's expected experts and (token, expert) pairs for uniform
routing (the router's balance is not in the trace); the op's ``total_experts`` argument names the
global expert count (the tracer's stand-in passes it, vllm-gaudi's call leaves it 0).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .hardware import dtype_family

MME = "MME"
TPC = "TPC"
NONE = "none"
LINK = "LINK"  # a collective over the scale-up links

_MATMUL = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "_scaled_mm"}
_NO_KERNEL = {
    "detach",
    "lift_fresh",
    "alias",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "_local_scalar_dense",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_same_size",
    "_has_compatible_shallow_copy_type",
    "resize_",
    "set_",
}
#: ops that return a view of their input in all but name (their schema declares no alias)
VIEW_LIKE = {"_unsafe_view", "_reshape_alias", "alias", "lift_fresh", "detach"}
#: ops that read only the rows they gather (read = output), or write only the rows they scatter
_GATHERS = {"index_select", "gather", "embedding", "index"}
_SCATTERS = {
    "index_copy",
    "index_copy_",
    "index_put",
    "index_put_",
    "scatter",
    "scatter_",
    "index_add",
    "index_add_",
    "scatter_add",
    "scatter_add_",
}
#: ops the graph compiler can fuse into a neighbouring pointwise kernel (beside those PyTorch tags
#: pointwise): dtype casts and copies
_FUSIBLE_EXTRA = {"_to_copy", "clone", "copy", "copy_", "where", "masked_fill", "masked_fill_", "fill_", "zero_"}
_REDUCTIONS = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "prod",
    "var",
    "std",
    "norm",
    "linalg_vector_norm",
    "cumsum",
    "cumprod",
    "argmax",
    "argmin",
    "logsumexp",
    "any",
    "all",
    "sort",
    "argsort",
    "topk",
}
#: vector FLOPs per element of a softmax (max, subtract, exp, sum, scale)
SOFTMAX_FLOPS = 5


@dataclass
class OpCost:
    engine: str
    family: str  # dtype family of the engine rate ("fp8", "bf16", "fp32")
    flops: float  # on the op's engine
    read: float  # bytes from HBM
    written: float  # bytes to HBM
    vector_flops: float = 0.0  # TPC work inside an MME op (FusedSDPA's softmax)
    fusible: bool = False  # a pointwise op the graph compiler may fuse with its neighbours


#: attribute on a tensor whose card copy is narrower than the traced one (a weight the card holds
#: in FP8 while the traced build holds it in bf16): the bytes per element the card reads
AT_REST_ITEMSIZE = "_cost_itemsize"


def touched_bytes(t: torch.Tensor) -> int:
    """Bytes an op reads from ``t``: its distinct elements (dims of stride 0 count once), at the
    itemsize the card holds it in."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n * (getattr(t, AT_REST_ITEMSIZE, None) or t.element_size()) if t.numel() else 0


def tensors_in(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    return []


def _family(tensors: list[torch.Tensor]) -> str:
    fams = {dtype_family(t.dtype) for t in tensors if t.is_floating_point()}
    if not fams:
        fams = {dtype_family(t.dtype) for t in tensors} or {"bf16"}
    for f in ("fp32", "bf16", "fp8"):
        if f in fams:
            return f
    return "bf16"


def _mme_family(a: torch.Tensor, b: torch.Tensor) -> str:
    fams = {dtype_family(a.dtype), dtype_family(b.dtype)}
    if fams == {"fp8"}:
        return "fp8"
    return "fp32" if "fp32" in fams else "bf16"


def is_view(func) -> bool:
    if func.overloadpacket.__name__ in VIEW_LIKE:
        return True
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def is_inplace(func) -> bool:
    return any(r.alias_info is not None and r.alias_info.is_write for r in func._schema.returns)


@functools.lru_cache(maxsize=64)
def busiest_card_hits(tokens: int, top_k: int, experts: int, cards: int) -> tuple[float, float]:
    """(experts hit, routed token-expert pairs) on the busiest of ``cards`` cards that each hold a
    contiguous ``experts / cards`` share, averaged over random uniform top-k routings of ``tokens``
    tokens (a fixed seed: the same answer every run)."""
    if cards <= 1:
        hit = experts * (1 - (1 - top_k / experts) ** tokens)
        return hit, float(tokens * top_k)
    per = experts // cards
    g = torch.Generator().manual_seed(0)
    n = min(tokens, 4096)  # beyond this every expert is hit; pairs scale linearly
    trials = 400 if n <= 64 else 16  # many tokens average themselves
    hits = pairs = 0.0
    for _ in range(trials):
        ids = torch.rand(n, experts, generator=g).topk(top_k, dim=1).indices
        card = ids // per
        load = torch.bincount(card.flatten(), minlength=cards).double() * (tokens / n)
        seen = torch.zeros(experts, dtype=torch.bool)
        seen[ids.flatten()] = True
        distinct = seen.view(cards, per).sum(1).double()
        busiest = int(torch.argmax(load + distinct * 1e-6))
        hits += float(distinct[busiest])
        pairs += float(load[busiest])
    return hits / trials, pairs / trials


def bind(func, args, kwargs) -> dict:
    """The call's arguments by their schema names (defaults filled in)."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _moe_cost(func, args, kwargs) -> OpCost:
    """hpu::mixture_of_experts.*: x [T, D], routing [T, k], w12 list [2I, D(/2 packed)], w3 list [D, I(/2)]."""
    p = bind(func, args, kwargs)
    name = str(func)
    x, ids = p["hidden_states"], p["expert_routing_table"]
    w12 = p.get("w12", p.get("w1"))
    w3 = p["w3"]
    local = len(w12)
    total = int(p.get("total_experts") or 0) or local
    tokens, top_k = ids.shape
    hit, pairs = busiest_card_hits(int(tokens), int(top_k), total, max(1, total // local))
    scales = [t for key in ("d_scale_w12", "d_scale_w3") for t in tensors_in(p.get(key))]
    per_expert = (touched_bytes(w12[0]) + touched_bytes(w3[0])) + sum(touched_bytes(s) for s in scales) / max(local, 1)
    hidden = x.shape[-1]
    inter = w3[0].shape[-1] * (2 if "mxfp4" in name else 1)  # packed fp4 holds two weights a byte
    flops = pairs * 2 * 3 * hidden * inter
    family = "fp8" if dtype_family(x.dtype) == "fp8" and dtype_family(w12[0].dtype) == "fp8" else "bf16"
    read = hit * per_expert + touched_bytes(x) + touched_bytes(ids) * 2
    written = x.shape[0] * hidden * 2
    return OpCost(MME, family, flops, read, written)


def _sdpa_cost(func, args, kwargs) -> OpCost:
    """hpu::sdpa_recomp_fwd (FusedSDPA): q [B, H, Tq, d], k/v [B, H, Tk, d]; flash-style, so the
    scores stay on chip: bytes are q, k, v, the mask and the output. The softmax is TPC work that
    the MME pipeline overlaps (the op's time is the larger of the two)."""
    p = bind(func, args, kwargs)
    q, k, v, mask, causal = p["q"], p["k"], p["v"], p.get("attention_mask"), bool(p.get("is_causal"))
    b, h, tq, d = q.shape
    tk = k.shape[-2]
    pairs = b * h * tq * tk
    if causal:  # the last tq keys are causal among themselves, the rest (context) all visible
        pairs -= b * h * tq * (tq - 1) / 2
    flops = 2 * pairs * d + 2 * pairs * v.shape[-1]
    read = sum(touched_bytes(t) for t in (q, k, v)) + (touched_bytes(mask) if isinstance(mask, torch.Tensor) else 0)
    written = b * h * tq * v.shape[-1] * q.element_size()
    return OpCost(MME, _mme_family(q, k), flops, read, written, vector_flops=SOFTMAX_FLOPS * pairs)


def op_cost(func, args, kwargs, out) -> OpCost:
    """The cost of ``func(*args, **kwargs) -> out`` (``out`` already computed, on meta or fake tensors)."""
    packet = func.overloadpacket.__name__
    namespace = func.namespace
    outs = tensors_in(out)
    ins = tensors_in(args) + tensors_in(kwargs)
    if namespace == "hpu" and packet == "mixture_of_experts":
        return _moe_cost(func, args, kwargs)
    if namespace == "hpu" and packet in ("sdpa_recomp_fwd", "fp8_sdpa_recomp_fwd"):
        return _sdpa_cost(func, args, kwargs)
    if packet in _NO_KERNEL or (namespace in ("aten", "prims") and is_view(func)):
        return OpCost(NONE, "bf16", 0.0, 0.0, 0.0)
    written = sum(t.numel() * t.element_size() for t in outs)
    if is_inplace(func):
        written = sum(touched_bytes(t) for t in outs)
    read = sum(touched_bytes(t) for t in ins)
    if packet in _MATMUL:
        a, b = (args[1], args[2]) if packet in ("addmm", "baddbmm", "addbmm") else (args[0], args[1])
        m, kdim = a.shape[-2], a.shape[-1]
        n = b.shape[-1]
        batch = math.prod(a.shape[:-2]) if a.dim() > 2 else 1
        return OpCost(MME, _mme_family(a, b), 2.0 * batch * m * kdim * n, read, written)
    if packet == "convolution":
        x, w = args[0], args[1]
        groups = args[8] if len(args) > 8 else 1
        depthwise = groups > 1 and w.shape[1] == 1
        flops = 2.0 * outs[0].numel() * w.shape[1] * math.prod(w.shape[2:])
        return OpCost(TPC if depthwise else MME, _family([x, w]), flops, read, written)
    if packet in _GATHERS:
        index = [t for t in ins if not t.is_floating_point() and t is not ins[0]]
        read = written + sum(touched_bytes(t) for t in index)
    elif packet in _SCATTERS:
        src = [t for t in ins[1:]]
        read = sum(touched_bytes(t) for t in src)
        written = sum(t.numel() * t.element_size() for t in src if t.is_floating_point()) or written
    pointwise = torch.Tag.pointwise in func.tags or packet in _FUSIBLE_EXTRA
    if packet in ("sort", "argsort", "topk"):  # a comparison network: n log2(n) per row
        flops = float(ins[0].numel()) * max(1.0, math.log2(max(ins[0].shape[-1] if ins[0].dim() else 1, 2)))
    elif packet in _REDUCTIONS:
        flops = float(sum(t.numel() for t in ins))
    elif packet in ("_softmax", "_log_softmax", "softmax"):
        flops = SOFTMAX_FLOPS * float(outs[0].numel()) if outs else 0.0
    else:
        flops = float(sum(t.numel() for t in outs))
    family = _family(ins + outs) if (ins or outs) else "bf16"
    return OpCost(TPC, family, flops, read, written, fusible=pointwise and namespace in ("aten", "prims"))
