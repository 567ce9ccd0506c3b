"""``torch.ops.hpu.*``: the emulated kernels as PyTorch operators.

:func:`register` defines each op once (idempotent) with a schema that accepts the calls
vllm-gaudi v0.26.0 makes (argument names, positions and overload names are those of the call
sites named in each kernel's docstring), a CPU implementation under the
``CompositeExplicitAutograd`` key (so a ``__torch_dispatch__`` tensor subclass sees the op
itself, not its decomposition) and a fake (meta) implementation for shape propagation.

Ops called with a Python float where a scale tensor is usual (``FP8Matmul``, ``VLLMFP8KVCache``)
get a ``.scalar`` overload; ``torch.ops.hpu.X(...)`` resolves between overloads by the
arguments, as the real bridge's ops do.
"""

from __future__ import annotations

import threading

import torch

from . import kernels as K
from .kernels.attention import is_gqa

NAMESPACE = "hpu"
_lock = threading.Lock()
_lib: torch.library.Library | None = None

# (qualified name with overload, schema arguments -> returns, cpu impl, fake impl)
_MOE_TAIL = 'bool permuted_weights=True, str activation="silu", int experts_min=0, int experts_max=0, int chunk_size=0, int total_experts=0'
_BIAS_TAIL = (
    "bool permuted_weights=True, int experts_min=0, int experts_max=0, int chunk_size=0, int total_experts=0, "
    "float alpha=1.702, float limit=7.0"
)
_MOE_HEAD = "Tensor hidden_states, Tensor expert_routing_table, Tensor router_weights"

SCHEMAS: dict[str, str] = {
    "sdpa_recomp_fwd": (
        "(Tensor q, Tensor k, Tensor v, Tensor? attention_mask, float dropout_p, float scale, bool is_causal, "
        "bool requires_backward, str softmax_mode, Tensor? valid_seq_len, str seq_padding_type, "
        "int[]? window_size=None, Tensor? sinks=None) -> (Tensor, Tensor, Tensor)"
    ),
    "fp8_sdpa_recomp_fwd": (
        "(Tensor q, Tensor k, Tensor v, Tensor? attention_mask, float dropout_p, float scale, bool is_causal, "
        "bool requires_backward, str softmax_mode, Tensor? d_scale_q, Tensor? d_scale_k, Tensor? d_scale_v, "
        "Tensor? q_scale_s, Tensor? q_scale_o, Tensor? d_scale_s, bool is_amax_s, bool is_amax_o, "
        "Tensor? valid_seq_len, str seq_padding_type, int[]? window_size=None, Tensor? sinks=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
    ),
    "rms_norm": "(Tensor data_in, Tensor gamma, float epsilon) -> Tensor",
    "rotary_pos_embedding": (
        "(Tensor input, Tensor sin, Tensor cos, Tensor? position_ids=None, int offset=0, int mode=0) -> Tensor"
    ),
    "mixture_of_experts": f"({_MOE_HEAD}, Tensor[] w1, Tensor[] w2, Tensor[] w3, {_MOE_TAIL}) -> Tensor",
    "mixture_of_experts.fused_weights": f"({_MOE_HEAD}, Tensor[] w12, Tensor[] w3, {_MOE_TAIL}) -> Tensor",
    "mixture_of_experts.fp8_fused_weights": (
        f"({_MOE_HEAD}, Tensor[] w12, Tensor[] w3, Tensor d_scale_hidden_states, Tensor[] d_scale_w12, "
        f"Tensor[] d_scale_w3, Tensor[]? d_scale_intermediate_hidden_states=None, {_MOE_TAIL}) -> Tensor"
    ),
    # The plugin's dynamic-scale overload (no intermediate scales): the fix moe-explicit-overload
    # names it, and so do Intel Neural Compressor's MoE wrappers; the packet call resolves the same
    # arguments to fp8_fused_weights here, where the intermediate scales default to None.
    "mixture_of_experts.fp8_fused_weights_dynamic": (
        f"({_MOE_HEAD}, Tensor[] w12, Tensor[] w3, Tensor d_scale_hidden_states, Tensor[] d_scale_w12, "
        f"Tensor[] d_scale_w3, {_MOE_TAIL}) -> Tensor"
    ),
    "mixture_of_experts.bias_fused_weights": (
        f"({_MOE_HEAD}, Tensor[] w12, Tensor[] w3, Tensor[] w12_bias, Tensor[] w3_bias, {_BIAS_TAIL}) -> Tensor"
    ),
    "mixture_of_experts.mxfp4_fused_weights": (
        f"({_MOE_HEAD}, Tensor[] w12, Tensor[] w3, Tensor[] d_scale_w12, Tensor[] d_scale_w3, int block_size=32, "
        'bool permuted_weights=True, str activation="silu", int experts_min=0, int experts_max=0, '
        "bool is_fp4=True, int chunk_size=0, int total_experts=0) -> Tensor"
    ),
    "mixture_of_experts.bias_mxfp4_fused_weights": (
        f"({_MOE_HEAD}, Tensor[] w12, Tensor[] w3, Tensor[] w12_bias, Tensor[] w3_bias, Tensor[] d_scale_w12, "
        "Tensor[] d_scale_w3, int block_size=32, bool permuted_weights=True, int experts_min=0, int experts_max=0, "
        "bool is_fp4=True, int chunk_size=0, int total_experts=0, float alpha=1.702, float limit=7.0) -> Tensor"
    ),
    "cast_to_fp8_v2": (
        "(Tensor input, Tensor? scale=None, bool stochastic_rounding=False, bool is_amax=False, "
        "ScalarType? dtype=None, int[]? scale_shape=None) -> (Tensor, Tensor)"
    ),
    "cast_to_fp8_v2.scalar": (
        "(Tensor input, float scale, bool stochastic_rounding=False, bool is_amax=False, "
        "ScalarType? dtype=None, int[]? scale_shape=None) -> (Tensor, Tensor)"
    ),
    "cast_from_fp8": "(Tensor input, Tensor? scale, ScalarType out_dtype, int[]? scale_shape=None) -> Tensor",
    "cast_from_fp8.scalar": "(Tensor input, float scale, ScalarType out_dtype, int[]? scale_shape=None) -> Tensor",
    "fp8_gemm_v2": (
        "(Tensor A, bool trans_A, Tensor B, bool trans_B, Tensor? D, ScalarType out_dtype, Tensor? A_scale_inv=None, "
        "Tensor? B_scale_inv=None, Tensor? bias=None, bool accumulate=False, int[]? B_scale_shape=None) -> Tensor"
    ),
    "fp8_gemm_v2.scalar": (
        "(Tensor A, bool trans_A, Tensor B, bool trans_B, Tensor? D, ScalarType out_dtype, float A_scale_inv, "
        "float B_scale_inv, Tensor? bias=None, bool accumulate=False, int[]? B_scale_shape=None) -> Tensor"
    ),
    "block_softmax": "(Tensor attn, Tensor? block_bias, Tensor? block_groups) -> (Tensor, Tensor, Tensor)",
    "block_softmax_adjustment": (
        "(Tensor block_max, Tensor block_sums, Tensor block_groups, int batch_size, int[] out_shape) -> Tensor"
    ),
    "convert_from_uint4": (
        "(Tensor input, Tensor scale, Tensor? zero_point, ScalarType out_dtype, Tensor? g_idx=None) -> Tensor"
    ),
}


def _clone_out(fn):
    """Op outputs must not alias inputs; the kernels already return fresh tensors except no-op casts."""

    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(_fresh(o, args) for o in out)
        return _fresh(out, args)

    return wrapped


def _fresh(t, args):
    for a in args:
        if isinstance(a, torch.Tensor) and isinstance(t, torch.Tensor) and t.data_ptr() == a.data_ptr() and t.numel():
            return t.clone()
    return t


IMPLS = {
    "sdpa_recomp_fwd": K.sdpa_recomp_fwd,
    "fp8_sdpa_recomp_fwd": K.fp8_sdpa_recomp_fwd,
    "rms_norm": K.rms_norm,
    "rotary_pos_embedding": K.rotary_pos_embedding,
    "mixture_of_experts": K.mixture_of_experts,
    "mixture_of_experts.fused_weights": K.mixture_of_experts_fused,
    "mixture_of_experts.fp8_fused_weights": K.mixture_of_experts_fp8_fused,
    "mixture_of_experts.fp8_fused_weights_dynamic": K.mixture_of_experts_fp8_fused_dynamic,
    "mixture_of_experts.bias_fused_weights": K.mixture_of_experts_bias_fused,
    "mixture_of_experts.mxfp4_fused_weights": K.mixture_of_experts_mxfp4_fused,
    "mixture_of_experts.bias_mxfp4_fused_weights": K.mixture_of_experts_bias_mxfp4_fused,
    "cast_to_fp8_v2": K.cast_to_fp8_v2,
    "cast_to_fp8_v2.scalar": K.cast_to_fp8_v2,
    "cast_from_fp8": K.cast_from_fp8,
    "cast_from_fp8.scalar": K.cast_from_fp8,
    "fp8_gemm_v2": K.fp8_gemm_v2,
    "fp8_gemm_v2.scalar": K.fp8_gemm_v2,
    "block_softmax": K.block_softmax,
    "block_softmax_adjustment": K.block_softmax_adjustment,
    "convert_from_uint4": K.convert_from_uint4,
}


# ---- fake (meta) implementations: shapes and dtypes only ----


def _attn_shapes(q, k, v):
    if is_gqa(q, k):
        lead = tuple(q.shape[:-2])
    else:
        lead = tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
    return lead + (q.shape[-2], v.shape[-1]), lead + (q.shape[-2], 1)


def _fake_sdpa(q, k, v, *args, **kwargs):
    out, stat = _attn_shapes(q, k, v)
    return q.new_empty(out), q.new_empty(stat, dtype=torch.float32), q.new_empty(stat, dtype=torch.float32)


def _fake_fp8_sdpa(
    q, k, v, mask, dropout_p, scale, is_causal, rb, sm, dq, dk, dv, qs, qo, ds, amax_s, amax_o, *rest, **kw
):
    out, stat = _attn_shapes(q, k, v)
    f32 = torch.float32
    out_dtype = torch.bfloat16 if qo is None else v.dtype
    return (
        q.new_empty(out, dtype=out_dtype),
        q.new_empty(stat, dtype=f32),
        q.new_empty(stat, dtype=f32),
        q.new_empty(() if amax_s else (0,), dtype=f32),
        q.new_empty(() if amax_o else (0,), dtype=f32),
    )


def _fake_moe(hidden_states, expert_routing_table, router_weights, *args, **kwargs):
    return hidden_states.new_empty(hidden_states.shape)


def _fake_moe_fp8(hidden_states, expert_routing_table, router_weights, *args, **kwargs):
    return hidden_states.new_empty(hidden_states.shape, dtype=router_weights.dtype)


def _fake_cast_to(input, scale=None, stochastic_rounding=False, is_amax=False, dtype=None, scale_shape=None):
    from .config import card

    dtype = card().fp8_e4m3 if dtype is None else dtype
    return input.new_empty(input.shape, dtype=dtype), input.new_empty(() if is_amax else (0,), dtype=torch.float32)


def _fake_cast_from(input, scale, out_dtype, scale_shape=None):
    return input.new_empty(input.shape, dtype=out_dtype)


def _fake_gemm(A, trans_A, B, trans_B, D, out_dtype, *args, **kwargs):
    a = A.transpose(-1, -2) if trans_A else A
    b = B.transpose(-1, -2) if trans_B else B
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return A.new_empty((*lead, a.shape[-2], b.shape[-1]), dtype=out_dtype)


def _fake_block_softmax(attn, block_bias, block_groups):
    stat = (*attn.shape[:-1], 1)
    return attn.new_empty(attn.shape), attn.new_empty(stat), attn.new_empty(stat)


def _fake_adjust(block_max, block_sums, block_groups, batch_size, out_shape):
    return block_max.new_empty(list(out_shape))


def _fake_uint4(input, scale, zero_point, out_dtype, g_idx=None):
    return input.new_empty((input.shape[0], input.shape[1] * 8), dtype=out_dtype)


FAKES = {
    "sdpa_recomp_fwd": _fake_sdpa,
    "fp8_sdpa_recomp_fwd": _fake_fp8_sdpa,
    "rms_norm": lambda data_in, gamma, epsilon: data_in.new_empty(data_in.shape),
    "rotary_pos_embedding": lambda input, *a, **k: input.new_empty(input.shape),
    "mixture_of_experts": _fake_moe,
    "mixture_of_experts.fused_weights": _fake_moe,
    "mixture_of_experts.fp8_fused_weights": _fake_moe_fp8,
    "mixture_of_experts.fp8_fused_weights_dynamic": _fake_moe_fp8,
    "mixture_of_experts.bias_fused_weights": _fake_moe,
    "mixture_of_experts.mxfp4_fused_weights": _fake_moe,
    "mixture_of_experts.bias_mxfp4_fused_weights": _fake_moe,
    "cast_to_fp8_v2": _fake_cast_to,
    "cast_to_fp8_v2.scalar": _fake_cast_to,
    "cast_from_fp8": _fake_cast_from,
    "cast_from_fp8.scalar": _fake_cast_from,
    "fp8_gemm_v2": _fake_gemm,
    "fp8_gemm_v2.scalar": _fake_gemm,
    "block_softmax": _fake_block_softmax,
    "block_softmax_adjustment": _fake_adjust,
    "convert_from_uint4": _fake_uint4,
}


def _exists(qualname: str) -> bool:
    name, _, overload = qualname.partition(".")
    packet = getattr(getattr(torch.ops, NAMESPACE), name, None) if hasattr(torch.ops, NAMESPACE) else None
    if packet is None:
        return False
    return (overload or "default") in packet.overloads()


def _has_op(qualname: str) -> bool:
    try:
        return _exists(qualname)
    except (AttributeError, RuntimeError):
        return False


def register() -> None:
    """Define every emulated op under ``torch.ops.hpu`` (no-op when already done)."""
    global _lib
    with _lock:
        if _lib is not None:
            return
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        for qualname, schema in SCHEMAS.items():
            if _has_op(qualname):
                continue  # defined by someone else in this process (e.g. a real bridge): leave it
            lib.define(qualname + schema)
            lib.impl(qualname, _clone_out(IMPLS[qualname]), "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{qualname}", FAKES[qualname], lib=lib)
        _lib = lib
