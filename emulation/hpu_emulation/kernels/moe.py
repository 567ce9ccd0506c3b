"""mixture_of_experts and its overloads (bf16, FP8, bias, MXFP4).

Call sites in vllm-gaudi v0.26.0 (b059f9c), ``vllm_gaudi/extension/ops.py``:

* ``VllmMixtureOfExpertsOp.forward``: ``mixture_of_experts(hidden_states=, expert_routing_table=,
  router_weights=, w12=, w3=, permuted_weights=, activation=, experts_min=, experts_max=
  [, chunk_size=, total_experts=])`` and ``mixture_of_experts.bias_fused_weights(..., w12_bias=,
  w3_bias=, ...)`` (no activation). ``w12`` is each local expert's fused gate+up weight
  (``w13_weight[e]``, vLLM's ``[2 * I, H]``: gate rows first), ``w3`` its down projection
  ``[H, I]``; ``permuted_weights=True`` is what every caller passes with these ``[out, in]``
  weights. With ``MAX_EXPERTS_PER_SLICE`` the caller splits the list and passes
  ``experts_min = first id of the slice``, ``experts_max = last id``, then sums the slices:
  expert id ``e`` in ``[experts_min, experts_max]`` uses list entry ``e - experts_min``, ids
  outside contribute 0 (that is also how expert parallelism splits experts across cards,
  ``ops/hpu_fused_moe.py``: ``experts_min = ep_rank * local_num_experts``).
* ``VllmMixtureOfExpertsOpFP8PerChannel.forward``: adds ``d_scale_hidden_states`` (per token
  ``[T, 1]`` from ``dynamic_quant``, or the static per-tensor input scale),
  ``d_scale_intermediate_hidden_states`` (a list of per-expert static scales of the down
  projection's input), ``d_scale_w12`` / ``d_scale_w3`` (per-expert lists, per-output-channel,
  ``scale_inv_fp8.squeeze()``); hidden_states are FP8 and the output takes the dtype of
  ``router_weights`` (``topk_weights.to(x.dtype)``).
* ``VllmMixtureOfExpertsOpMXFP4._get_compiled_forward``: ``mixture_of_experts.mxfp4_fused_weights(
  hidden_states, expert_routing_table, router_weights, w12_list, w3_list, d_scale_w12,
  d_scale_w3, block_size=, permuted_weights=True, activation=, experts_min=, experts_max=,
  is_fp4=True, chunk_size=, total_experts=)`` and ``bias_mxfp4_fused_weights`` (adds w12_bias,
  w3_bias after w3, and alpha/limit; "the op applies gpt_swiglu (clamp +-limit, alpha-silu)
  internally and the activation string is ignored"). ``MoeMXFP4Matmul``: weights uint8
  ``[rows, cols / 2]`` (two E2M1 values per byte), scales uint8 E8M0 ``[rows, cols / 32]``.
* ``ops.py`` top: HF ``gelu_pytorch_tanh`` etc. map to the op's ``gelu`` because "the Gaudi gelu
  TPC kernel already uses the tanh approximation".

Semantics emulated: for token t and slot k with ``e = expert_routing_table[t, k]`` in range,
``out[t] += router_weights[t, k] * down_e(act(gate_up_e(x_t)))``, with
``act = silu | gelu(tanh) | relu`` of the gate half times the up half.

Assumed: the bias overloads (GPT-OSS) use vLLM's ``swigluoai`` convention: gate/up interleaved
in the rows of w12 (gate = even rows), ``gate.clamp(max=limit)``, ``up.clamp(-limit, limit)``,
``(up + 1) * gate * sigmoid(alpha * gate)``, defaults alpha 1.702 and limit 7.0 (the values
``VllmMixtureOfExpertsOpMXFP4`` passes); GPT-OSS checkpoints keep the interleaved order and
vllm-gaudi does not reorder them. ``permuted_weights=False`` means ``[in, out]`` weights.
MXFP4: element ``2i`` in the low nibble, E8M0 value ``2 ** (code - 127)`` (code 255 is NaN),
the OCP MX layout the project's ``ports/glm-5-mxfp4/glm5_mxfp4/mxfp4.py`` also uses.
Everything is computed in float32 and rounded once to the output dtype (the card keeps bf16
intermediates; that rounding is not modelled). ``chunk_size`` / ``total_experts`` only tune the
card's kernel and are ignored. FP8 block scales (2-D per-expert scale tensors) are read as
``[ceil(rows / b0), ceil(cols / b1)]`` blocks.
Not emulated (NotImplementedError): other activations, ``is_fp4=False``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .fp8 import card_read, fp8_quantize

ACTIVATIONS = ("silu", "gelu", "relu")
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _gated(activation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if activation == "silu":
        act = F.silu
    elif activation == "gelu":
        act = lambda g: F.gelu(g, approximate="tanh")  # noqa: E731
    elif activation == "relu":
        act = F.relu
    else:
        raise NotImplementedError(f"mixture_of_experts emulation: activation {activation!r}, emulated: {ACTIVATIONS}")

    def fn(h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        return act(gate) * up

    return fn


def gpt_swiglu(alpha: float, limit: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(h: torch.Tensor) -> torch.Tensor:
        gate, up = h[..., 0::2], h[..., 1::2]
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    return fn


def _check_bias(w12, w12_bias, w3_bias) -> None:
    # ops.py's sliced bias loop passes the whole weight list with bias slices; what the card does
    # with such a call is unknown.
    if len(w12_bias) != len(w12) or len(w3_bias) != len(w12):
        raise NotImplementedError(
            f"mixture_of_experts bias emulation: {len(w12)} experts with {len(w12_bias)} / {len(w3_bias)} biases"
        )


def _oriented(w: torch.Tensor, permuted_weights: bool) -> torch.Tensor:
    """Float32 ``[out, in]``."""
    w = w.float()
    return w if permuted_weights else w.transpose(-1, -2)


def _moe(
    x: torch.Tensor,
    expert_routing_table: torch.Tensor,
    router_weights: torch.Tensor,
    n_local: int,
    experts_min: int,
    experts_max: int,
    w12: Callable[[int], torch.Tensor],
    w3: Callable[[int], torch.Tensor],
    act: Callable[[torch.Tensor], torch.Tensor],
    b12: Callable[[int], torch.Tensor | None] | None = None,
    b3: Callable[[int], torch.Tensor | None] | None = None,
    inter: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Float32 ``[T, H]``: the routed, weighted sum of the local experts' MLPs.

    Runs on plain CPU tensors inside one op, so data-dependent gathers are fine here.
    """
    ids = expert_routing_table.to(torch.int64)
    rw = router_weights.float()
    hidden = w3(0).shape[0]
    out = x.new_zeros(x.shape[0], hidden, dtype=torch.float32)
    in_range = (ids >= experts_min) & (ids <= experts_max)
    if bool((in_range & (ids >= experts_min + n_local)).any()):
        raise ValueError(
            f"mixture_of_experts: expert ids up to {experts_max} routed, but only {n_local} weights from {experts_min}"
        )
    for e in range(min(n_local, experts_max - experts_min + 1)):
        sel = ids == experts_min + e
        tokens = sel.any(dim=-1).nonzero().squeeze(1)
        if tokens.numel() == 0:
            continue
        weight = (rw * sel).sum(dim=-1).index_select(0, tokens)
        xe = x.index_select(0, tokens)
        h = xe @ w12(e).transpose(0, 1)
        if b12 is not None:
            h = h + b12(e).float()
        a = act(h)
        if inter is not None:
            a = inter(e, a)
        y = a @ w3(e).transpose(0, 1)
        if b3 is not None:
            y = y + b3(e).float()
        out.index_add_(0, tokens, y * weight.unsqueeze(1))
    return out


def mixture_of_experts(
    hidden_states: torch.Tensor,
    expert_routing_table: torch.Tensor,
    router_weights: torch.Tensor,
    w1: Sequence[torch.Tensor],
    w2: Sequence[torch.Tensor],
    w3: Sequence[torch.Tensor],
    permuted_weights: bool = True,
    activation: str = "silu",
    experts_min: int = 0,
    experts_max: int = 0,
    chunk_size: int = 0,
    total_experts: int = 0,
) -> torch.Tensor:
    """Default overload: separate gate (w1), up (w2) and down (w3) lists; same math as fused."""
    w12 = [
        torch.cat((_oriented(a, permuted_weights), _oriented(b, permuted_weights)), dim=0)
        for a, b in zip(w1, w2, strict=True)
    ]
    down = [_oriented(w, permuted_weights) for w in w3]
    out = mixture_of_experts_fused(
        hidden_states, expert_routing_table, router_weights, w12, down, True, activation, experts_min, experts_max
    )
    return out.to(hidden_states.dtype)


def mixture_of_experts_fused(
    hidden_states,
    expert_routing_table,
    router_weights,
    w12,
    w3,
    permuted_weights=True,
    activation="silu",
    experts_min=0,
    experts_max=0,
    chunk_size=0,
    total_experts=0,
):
    """``.fused_weights``: w12 = [gate; up] per expert."""
    act = _gated(activation)
    out = _moe(
        hidden_states.float(),
        expert_routing_table,
        router_weights,
        len(w12),
        experts_min,
        experts_max,
        lambda e: _oriented(w12[e], permuted_weights),
        lambda e: _oriented(w3[e], permuted_weights),
        act,
    )
    return out.to(hidden_states.dtype)


def mixture_of_experts_bias_fused(
    hidden_states,
    expert_routing_table,
    router_weights,
    w12,
    w3,
    w12_bias,
    w3_bias,
    permuted_weights=True,
    experts_min=0,
    experts_max=0,
    chunk_size=0,
    total_experts=0,
    alpha=1.702,
    limit=7.0,
):
    """``.bias_fused_weights``: per-expert biases and GPT-OSS SwiGLU (see module docstring)."""
    _check_bias(w12, w12_bias, w3_bias)
    out = _moe(
        hidden_states.float(),
        expert_routing_table,
        router_weights,
        len(w12),
        experts_min,
        experts_max,
        lambda e: _oriented(w12[e], permuted_weights),
        lambda e: _oriented(w3[e], permuted_weights),
        gpt_swiglu(alpha, limit),
        lambda e: w12_bias[e],
        lambda e: w3_bias[e],
    )
    return out.to(hidden_states.dtype)


def dequant_fp8_weight(w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Float32 dequantised FP8 weight ``[rows, cols]``; scale per tensor, per row or 2-D blocks. The
    stored bytes are read as the emulated card reads them (``fp8.card_read``: on Gaudi 2 an e4m3fn
    code above 240 is inf or NaN)."""
    wf = card_read(w)
    if scale is None:
        return wf
    s = scale.float()
    rows, cols = wf.shape[-2], wf.shape[-1]
    if s.numel() == 1:
        return wf * s.reshape(())
    if s.numel() == rows and (s.dim() == 1 or s.shape[-1] == 1):
        return wf * s.reshape(rows, 1)
    if s.dim() == 2:
        sr, sc = s.shape
        b0, b1 = math.ceil(rows / sr), math.ceil(cols / sc)
        if math.ceil(rows / b0) != sr or math.ceil(cols / b1) != sc:
            raise NotImplementedError(f"FP8 MoE emulation: scale {tuple(s.shape)} for weight [{rows}, {cols}]")
        full = s.repeat_interleave(b0, dim=0)[:rows].repeat_interleave(b1, dim=1)[:, :cols]
        return wf * full
    raise NotImplementedError(f"FP8 MoE emulation: scale layout {tuple(s.shape)} for weight [{rows}, {cols}]")


def mixture_of_experts_fp8_fused(
    hidden_states,
    expert_routing_table,
    router_weights,
    w12,
    w3,
    d_scale_hidden_states,
    d_scale_w12,
    d_scale_w3,
    d_scale_intermediate_hidden_states=None,
    permuted_weights=True,
    activation="silu",
    experts_min=0,
    experts_max=0,
    chunk_size=0,
    total_experts=0,
):
    """FP8 fused weights with per-tensor / per-channel / block weight scales.

    x = hidden_states * d_scale_hidden_states (per tensor or per token ``[T, 1]``). With static
    ``d_scale_intermediate_hidden_states`` the activation is quantised to w3's FP8 dtype with it
    (``fp8(a / s) * s``) before the down projection, as an FP8 GEMM would see it.
    """
    act = _gated(activation)
    x = card_read(hidden_states)
    if d_scale_hidden_states is not None:
        s = d_scale_hidden_states.float()
        x = x * (s.reshape(()) if s.numel() == 1 else s.reshape(-1, 1))

    inter = None
    if d_scale_intermediate_hidden_states is not None:

        def inter(e, a):
            s = d_scale_intermediate_hidden_states[e].float()
            return card_read(fp8_quantize(a / s, w3[e].dtype)) * s

    out = _moe(
        x,
        expert_routing_table,
        router_weights,
        len(w12),
        experts_min,
        experts_max,
        lambda e: _oriented(dequant_fp8_weight(w12[e], d_scale_w12[e]), permuted_weights),
        lambda e: _oriented(dequant_fp8_weight(w3[e], d_scale_w3[e]), permuted_weights),
        act,
        inter=inter,
    )
    return out.to(router_weights.dtype)


def mixture_of_experts_fp8_fused_dynamic(
    hidden_states,
    expert_routing_table,
    router_weights,
    w12,
    w3,
    d_scale_hidden_states,
    d_scale_w12,
    d_scale_w3,
    permuted_weights=True,
    activation="silu",
    experts_min=0,
    experts_max=0,
    chunk_size=0,
    total_experts=0,
):
    """``mixture_of_experts.fp8_fused_weights_dynamic``: the plugin's overload for a dynamic
    (per-token) input scale and no intermediate scales; the same computation as
    :func:`mixture_of_experts_fp8_fused` with ``d_scale_intermediate_hidden_states=None``
    (vllm-gaudi's ``VllmMixtureOfExpertsOpFP8PerChannel`` dynamic branch, as the fix
    moe-explicit-overload calls it by name; Intel Neural Compressor's MoE wrappers name it too).
    """
    return mixture_of_experts_fp8_fused(
        hidden_states,
        expert_routing_table,
        router_weights,
        w12,
        w3,
        d_scale_hidden_states,
        d_scale_w12,
        d_scale_w3,
        None,
        permuted_weights,
        activation,
        experts_min,
        experts_max,
        chunk_size,
        total_experts,
    )


def dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor, block_size: int = 32) -> torch.Tensor:
    """uint8 ``[..., n / 2]`` E2M1 pairs + uint8 E8M0 ``[..., ceil(n / block)]`` -> float32 ``[..., n]``."""
    p = packed.to(torch.uint8)
    nib = torch.stack((p & 0x0F, p >> 4), dim=-1).flatten(-2).to(torch.int64)
    lut = torch.tensor(E2M1, dtype=torch.float32, device=p.device)
    vals = lut[nib & 7] * torch.where((nib & 8) != 0, -1.0, 1.0)
    n = vals.shape[-1]
    codes = scales.to(torch.uint8).to(torch.int32)
    factor = torch.exp2(codes.float() - 127.0)
    factor = torch.where(codes == 255, torch.full_like(factor, float("nan")), factor)
    if factor.shape[-1] * block_size < n:
        raise ValueError(f"{factor.shape[-1]} scales of block {block_size} do not cover {n} values")
    factor = factor.repeat_interleave(block_size, dim=-1)[..., :n]
    return vals * factor


def _check_fp4(is_fp4: bool) -> None:
    if not is_fp4:
        raise NotImplementedError("mixture_of_experts MX emulation: is_fp4=False (MXFP8 weights)")


def mixture_of_experts_mxfp4_fused(
    hidden_states,
    expert_routing_table,
    router_weights,
    w12,
    w3,
    d_scale_w12,
    d_scale_w3,
    block_size=32,
    permuted_weights=True,
    activation="silu",
    experts_min=0,
    experts_max=0,
    is_fp4=True,
    chunk_size=0,
    total_experts=0,
):
    """``.mxfp4_fused_weights``: MXFP4 w12 / w3 with E8M0 scales, gated activation."""
    _check_fp4(is_fp4)
    out = _moe(
        hidden_states.float(),
        expert_routing_table,
        router_weights,
        len(w12),
        experts_min,
        experts_max,
        lambda e: _oriented(dequant_mxfp4(w12[e], d_scale_w12[e], block_size), permuted_weights),
        lambda e: _oriented(dequant_mxfp4(w3[e], d_scale_w3[e], block_size), permuted_weights),
        _gated(activation),
    )
    return out.to(hidden_states.dtype)


def mixture_of_experts_bias_mxfp4_fused(
    hidden_states,
    expert_routing_table,
    router_weights,
    w12,
    w3,
    w12_bias,
    w3_bias,
    d_scale_w12,
    d_scale_w3,
    block_size=32,
    permuted_weights=True,
    experts_min=0,
    experts_max=0,
    is_fp4=True,
    chunk_size=0,
    total_experts=0,
    alpha=1.702,
    limit=7.0,
):
    """``.bias_mxfp4_fused_weights``: MXFP4 weights, biases, GPT-OSS SwiGLU (alpha, limit)."""
    _check_fp4(is_fp4)
    _check_bias(w12, w12_bias, w3_bias)
    out = _moe(
        hidden_states.float(),
        expert_routing_table,
        router_weights,
        len(w12),
        experts_min,
        experts_max,
        lambda e: _oriented(dequant_mxfp4(w12[e], d_scale_w12[e], block_size), permuted_weights),
        lambda e: _oriented(dequant_mxfp4(w3[e], d_scale_w3[e], block_size), permuted_weights),
        gpt_swiglu(alpha, limit),
        lambda e: w12_bias[e],
        lambda e: w3_bias[e],
    )
    return out.to(hidden_states.dtype)
