"""Fused scaled-dot-product attention (FusedSDPA, its recompute op forms and the FP8 variant).

Semantics come from the call sites in vllm-gaudi v0.26.0 (b059f9c):

* ``vllm_gaudi/extension/ops.py:_fsdpa_prompt_attention`` calls ``FusedSDPA.apply(q, k, v,
  attn_bias, 0.0, is_causal, scale, softmax_mode, recompute_mode, valid_seq_lengths,
  'right'[, window_size][, sinks])`` with q/k/v as ``[batch, heads, seq, head_dim]``; its
  native twin ``_naive_prompt_attention`` (same file) defines the math: additive bias, GQA by
  grouping query heads per kv head, and sinks as one extra logit column per query head that
  takes part in the softmax and is then dropped.
* ``vllm_gaudi/extension/utils.py:ModuleFusedSDPA.forward`` passes two ``False`` flags
  positionally after ``padding_side`` and ``window_size`` as ``(left, right)`` with
  ``(-1, -1)`` meaning "no window"; ``hpu_attn.py`` builds ``window_size = (sliding_window, 0)``
  where the runner would otherwise build the mask of
  ``hpu_model_runner.py:_set_attn_bias_for_sliding_window`` (``tril`` then
  ``triu(diagonal=1 - window)``), so ``left`` counts the keys including the query's own
  position: key j is visible from query i when ``i - left < j <= i + right``.
* ``utils.py:SlicedFusedSDPA`` calls ``torch.ops.hpu.sdpa_recomp_fwd(q, k, v, mask, dropout_p,
  scale, is_causal, True, softmax_mode, None, 'right')`` and uses the first three results as
  ``(out, m, linv)``: ``_merge_chunk`` combines chunks with ``1/linv * exp(m - new_m)``, so
  ``m`` is the row maximum of the scaled, masked logits and ``linv`` the reciprocal of the row's
  sum of ``exp(logit - m)``; both broadcast against ``out`` as ``[..., q_len, 1]``.
* ``utils.py:SlicedFP8FusedSDPA._fp8_fsdpa_fwd`` fixes the positional schema of
  ``fp8_sdpa_recomp_fwd``; its ``chunk_kernel`` multiplies ``linv`` by 128 in softmax_mode
  'fast', from which we take that the FP8 kernel reports ``linv / 128`` in that mode.
* ``utils.py:ModuleFP8FusedSDPA.forward`` calls ``fp8_fused_sdpa(q8, k8, v8, attn_mask=...,
  d_scale_q=..., d_scale_k=..., d_scale_v=..., q_scale_s=..., d_scale_s=..., is_amax_s=False,
  valid_seq_len=..., seq_padding_type=...)`` and uses ``results[0]`` as the attention output
  (bf16 when no ``q_scale_o`` is given).

Assumed (not stated by the call sites; Intel's public pages on FusedSDPA were not found in the
searchable corpora): a boolean ``attn_mask`` marks visible positions (True = attend), as in
``torch.nn.functional.scaled_dot_product_attention``; ``valid_seq_len`` masks keys only (right
padding: keys ``j >= len`` are hidden; left padding: keys ``j < kv_len - len``); a row with no
visible key (and no sink) gives 0 instead of NaN. softmax_mode 'None', 'fast' and 'fp32' all
compute the exact softmax in float32 here: 'fast' is a lower-precision exp on the card, and
the emulation does not model that error. ``recompute_mode`` only trades memory on the card and
does not change the math. Causal masking, windows and ``valid_seq_len`` are only emulated for
``q_len == kv_len`` (that is the only case vllm-gaudi reaches; the alignment for
``q_len != kv_len`` is not documented), anything else raises NotImplementedError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .fp8 import card_read, fp8_quantize

SOFTMAX_MODES = ("None", "fast", "fp32")
PADDING_SIDES = ("left", "right")


def is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """True when q has more heads than k (``[batch, heads, seq, dim]`` layout)."""
    return q.dim() == 4 and q.shape[1] != k.shape[1]


def gqa_input_reshape_fwd(q, k, v, attn_mask=None):
    """``[B, Hq, Q, D]`` / ``[B, Hkv, K, D]`` -> ``[B, Hkv, G, Q, D]`` / ``[B, Hkv, 1, K, D]``.

    The mask follows: ``[B, 1, Q, K]`` gains a group axis of 1, ``[B, Hq, Q, K]`` is split into
    ``[B, Hkv, G, Q, K]``. Query head ``h`` belongs to kv head ``h // G``, the grouping of
    ``_naive_prompt_attention`` (``query.unflatten(1, (kv_heads, -1))``).
    """
    kv_heads = k.shape[1]
    if q.shape[1] % kv_heads:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of kv heads {kv_heads}")
    q = q.unflatten(1, (kv_heads, -1))
    k = k.unsqueeze(2)
    v = v.unsqueeze(2)
    if attn_mask is not None and attn_mask.dim() == 4:
        # Masks of fewer dims broadcast from the right and need no change.
        if attn_mask.shape[1] == 1:
            attn_mask = attn_mask.unsqueeze(2)
        else:
            attn_mask = attn_mask.unflatten(1, (kv_heads, -1))
    return q, k, v, attn_mask


def gqa_output_reshape(x: torch.Tensor) -> torch.Tensor:
    """``[B, Hkv, G, Q, X]`` -> ``[B, Hkv * G, Q, X]`` (inverse of the query reshape)."""
    return x.flatten(1, 2)


def _window(window_size) -> tuple[int, int] | None:
    if window_size is None:
        return None
    if isinstance(window_size, int):
        # A bare int is read as (window, 0), the form hpu_attn.py builds.
        window_size = (window_size, 0)
    left, right = (int(x) for x in window_size)
    if left < 0 and right < 0:
        return None
    return left, right


def _check_common(dropout_p: float, softmax_mode: str, padding_side: str) -> None:
    if dropout_p:
        raise NotImplementedError(f"FusedSDPA emulation: dropout_p={dropout_p} (only inference, 0.0)")
    if softmax_mode not in SOFTMAX_MODES:
        raise NotImplementedError(f"FusedSDPA emulation: softmax_mode={softmax_mode!r}, emulated: {SOFTMAX_MODES}")
    if padding_side not in PADDING_SIDES:
        raise NotImplementedError(f"FusedSDPA emulation: padding_side={padding_side!r}")


def _visible(q_len: int, kv_len: int, batch_shape, is_causal, window, valid_seq_len, padding_side, device):
    """Boolean visibility ``[..., Q, K]`` from causal / window / valid lengths, or None if all visible."""
    rows = torch.arange(q_len, device=device).view(-1, 1)
    cols = torch.arange(kv_len, device=device).view(1, -1)
    vis = None
    if is_causal or window is not None or valid_seq_len is not None:
        if q_len != kv_len:
            raise NotImplementedError(
                "FusedSDPA emulation: is_causal / window_size / valid_sequence_lengths with "
                f"q_len {q_len} != kv_len {kv_len} (alignment not documented, not reached by vllm-gaudi)"
            )
    if is_causal:
        vis = cols <= rows
    if window is not None:
        left, right = window
        w = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
        if left >= 0:
            w &= cols > rows - left
        if right >= 0:
            w &= cols <= rows + right
        vis = w if vis is None else vis & w
    if valid_seq_len is not None:
        lens = valid_seq_len.to(device=device, dtype=torch.int64).reshape(-1)
        # Batch is dim 0 of every layout (4D and the 5D GQA form).
        lens = lens.view(-1, *([1] * (len(batch_shape) - 1)), 1, 1)
        if padding_side == "right":
            kv_ok = cols < lens
        else:
            kv_ok = cols >= kv_len - lens
        vis = kv_ok if vis is None else vis & kv_ok
    return vis


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    scale: float,
    is_causal: bool,
    valid_seq_len: torch.Tensor | None,
    padding_side: str,
    window_size,
    sinks: torch.Tensor | None,
    p_quant=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 ``(out, m, linv)``; q ``[..., Q, D]``, k ``[..., K, D]``, v ``[..., K, Dv]``.

    Leading dims broadcast (4D, or the 5D GQA form). A 4D call with fewer kv heads than query
    heads is grouped here and flattened back. ``p_quant`` (FP8 path) maps the unnormalised
    probabilities before the P @ V product.
    """
    if is_gqa(q, k):
        q5, k5, v5, m5 = gqa_input_reshape_fwd(q, k, v, attn_mask)
        out, m, linv = attention_core(
            q5, k5, v5, m5, scale, is_causal, valid_seq_len, padding_side, window_size, sinks, p_quant
        )
        return gqa_output_reshape(out), gqa_output_reshape(m), gqa_output_reshape(linv)

    qf, kf, vf = q.float(), k.float(), v.float()
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    q_len, kv_len = s.shape[-2], s.shape[-1]
    neg_inf = torch.tensor(float("-inf"), dtype=s.dtype, device=s.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = torch.where(attn_mask, s, neg_inf)
        else:
            s = s + attn_mask.float()
    vis = _visible(q_len, kv_len, s.shape[:-2], is_causal, _window(window_size), valid_seq_len, padding_side, s.device)
    if vis is not None:
        s = torch.where(vis, s, neg_inf)

    m = s.amax(dim=-1, keepdim=True)
    sink = None
    if sinks is not None:
        heads = q.shape[1:-2]
        sink = sinks.float().reshape(1, *heads, 1, 1)
        m = torch.maximum(m, sink)
    # Rows with nothing visible: exp(-inf - -inf) would be NaN; shift by 0 instead.
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe)
    l_sum = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        l_sum = l_sum + torch.exp(sink - m_safe)
    if p_quant is not None:
        p = p_quant(p)
    out = torch.matmul(p, vf)
    linv = 1.0 / l_sum
    out = torch.where(l_sum > 0, out * linv, torch.zeros_like(out))
    return out, m, linv


def _default_scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def sdpa_recomp_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    is_causal: bool = False,
    requires_backward: bool = False,
    softmax_mode: str = "None",
    valid_seq_len: torch.Tensor | None = None,
    seq_padding_type: str = "left",
    window_size: Sequence[int] | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, m, linv)`` of bf16/fp32 FusedSDPA; out in q's dtype, m and linv float32 ``[..., Q, 1]``.

    Call site: ``vllm_gaudi/extension/utils.py:SlicedFusedSDPA.forward`` (b059f9c), positional
    ``(q, k, v, mask, dropout_p, scale, is_causal, requires_backward, softmax_mode,
    valid_seq_len, padding_side)``; ``window_size`` and ``sinks`` are trailing additions so that
    ``FusedSDPA.apply`` maps onto this one op. ``requires_backward`` does not change the forward.
    """
    _check_common(dropout_p, softmax_mode, seq_padding_type)
    out, m, linv = attention_core(
        q,
        k,
        v,
        attention_mask,
        _default_scale(q, scale),
        is_causal,
        valid_seq_len,
        seq_padding_type,
        window_size,
        sinks,
    )
    return out.to(q.dtype), m, linv


def fused_sdpa(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    softmax_mode="None",
    recompute_mode=None,
    valid_sequence_lengths=None,
    padding_side="left",
    window_size=None,
    sinks=None,
):
    """FusedSDPA forward output only (see the module docstring for the semantics)."""
    return sdpa_recomp_fwd(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        scale,
        is_causal,
        False,
        softmax_mode,
        valid_sequence_lengths,
        padding_side,
        window_size,
        sinks,
    )[0]


def _scalar(x, default: float = 1.0) -> torch.Tensor | float:
    if x is None:
        return default
    return x.float()


def fp8_sdpa_recomp_fwd(
    q,
    k,
    v,
    attention_mask=None,
    dropout_p=0.0,
    scale=None,
    is_causal=False,
    requires_backward=False,
    softmax_mode="None",
    d_scale_q=None,
    d_scale_k=None,
    d_scale_v=None,
    q_scale_s=None,
    q_scale_o=None,
    d_scale_s=None,
    is_amax_s=False,
    is_amax_o=False,
    valid_seq_len=None,
    seq_padding_type="left",
    window_size=None,
    sinks=None,
):
    """FP8 FusedSDPA: ``(out, m, linv, amax_s, amax_o)``.

    Positional schema from ``utils.py:SlicedFP8FusedSDPA._fp8_fsdpa_fwd`` (b059f9c). q/k/v are
    FP8 (or high precision) and are dequantised with ``d_scale_q/k/v`` (per-tensor). When
    ``q_scale_s`` is given the unnormalised probabilities are quantised to the FP8 dtype of v
    (times ``q_scale_s``) and dequantised with ``d_scale_s`` before the P @ V product, the way
    an FP8 P @ V matmul sees them. With ``q_scale_o`` the output is quantised (times
    ``q_scale_o``) to v's FP8 dtype, else it is bf16. In softmax_mode 'fast' ``linv`` is
    reported divided by 128 (the caller's ``chunk_kernel`` multiplies it back). ``amax_s`` /
    ``amax_o`` are the max |P| / |out| when requested, else empty.
    """
    _check_common(dropout_p, softmax_mode, seq_padding_type)
    fp8_dtype = v.dtype if v.dtype.itemsize == 1 else None
    qd = card_read(q) * _scalar(d_scale_q)
    kd = card_read(k) * _scalar(d_scale_k)
    vd = card_read(v) * _scalar(d_scale_v)
    amax_s = []

    p_quant = None
    if q_scale_s is not None:
        if fp8_dtype is None:
            raise NotImplementedError("fp8 FusedSDPA emulation: q_scale_s with non-FP8 value tensor")

        def p_quant(p):
            amax_s.append(p.abs().amax())
            return card_read(fp8_quantize(p * q_scale_s.float(), fp8_dtype)) * _scalar(d_scale_s)

    out, m, linv = attention_core(
        qd,
        kd,
        vd,
        attention_mask,
        _default_scale(q, scale),
        is_causal,
        valid_seq_len,
        seq_padding_type,
        window_size,
        sinks,
        p_quant,
    )
    if is_amax_s and not amax_s:
        raise NotImplementedError("fp8 FusedSDPA emulation: is_amax_s without q_scale_s")
    amax_o = out.abs().amax() if is_amax_o else out.new_empty(0)
    if q_scale_o is not None:
        if fp8_dtype is None:
            raise NotImplementedError("fp8 FusedSDPA emulation: q_scale_o with non-FP8 value tensor")
        out = fp8_quantize(out * q_scale_o.float(), fp8_dtype)
    else:
        out = out.to(torch.bfloat16)
    if softmax_mode == "fast":
        linv = linv / 128.0
    s_amax = amax_s[0] if (is_amax_s and amax_s) else m.new_empty(0)
    return out, m, linv, s_amax, amax_o
