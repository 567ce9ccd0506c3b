"""FP8 casts and the FP8 GEMM (``cast_to_fp8_v2``, ``cast_from_fp8``, ``fp8_gemm_v2``).

Call sites in vllm-gaudi v0.26.0 (b059f9c):

* ``vllm_gaudi/extension/ops.py:dynamic_quant``: ``scale = amax / FP8_MAX`` then
  ``cast_to_fp8_v2(data, 1.0 / scale, False, False, torch.float8_e4m3fn)[0]`` and the
  dequantisation scale returned is ``scale``: the cast multiplies by its ``scale`` argument,
  and the scale may be per tensor (0-d) or per row (``[..., 1]``, broadcast).
* ``ops.py:apply_fp8_linear_hpu`` / ``utils.py:FP8Matmul.matmul_fp8``: ``fp8_gemm_v2(A=,
  trans_A=, B=, trans_B=, D=None, out_dtype=, A_scale_inv=, B_scale_inv=, bias=,
  accumulate=False)`` with ``A_scale_inv`` the value ``dynamic_quant`` returned (per row or per
  tensor), ``B_scale_inv`` the weight's per-tensor or per-output-channel scale; FP8Matmul
  passes Python floats, hence the ``.scalar`` overloads.
* ``utils.py:VLLMFP8KVCache``: ``cast_from_fp8(x, scale, torch.bfloat16)`` multiplies by scale.
* ``ops.py`` module top: on Gaudi 2 ``FP8_MAX = finfo(float8_e4m3fnuz).max`` (240) while the
  casts still ask for ``torch.float8_e4m3fn``: the card's e4m3 range is +-240, so on an emulated
  Gaudi 2 e4m3 casts saturate at 240 whichever e4m3 dtype is requested (``config.card()``).

How a card reads stored e4m3 bytes (:func:`card_read`; every kernel here, ``moe.py`` and
``attention.py`` read FP8 inputs through it, and so does the device layer's dtype conversion of a
card tensor, ``refusals.py``):

* **Gaudi 2** reads ``torch.float8_e4m3fn`` as E4M3 with exponent bias 7 and IEEE-754 special
  values: the exponent field 1111 is not a finite number, so the largest finite value is
  1.875 * 2**7 = 240 (``0x77``), and the codes a float8_e4m3fn tensor uses for 256 to 448
  (``0x78``-``0x7e``, and their negatives) read as infinity (mantissa 000: ``0x78`` / ``0xf8``)
  or NaN (any other mantissa). Sources: the bridge's own range, Intel's
  HabanaAI/gaudi-pytorch-bridge 1.19.0 ``python_packages/habana_frameworks/torch/core/observer.py``
  (``MAX_RANGE[float8_e4m3fn] = 2 ** (2**4 - 2 - 7) * (2 - 2**-3)`` = 240, the top exponent code
  reserved; ``hpu_ops/backend/optimizer_adamw_gen.cpp``: "240.0 // Float8_e4m3fn max");
  vllm-gaudi b059f9c ``extension/scales.py`` (``EXP_BIAS_SETS[("GAUDI2", float8_e4m3fn)] = [3, 7,
  11, 15]``, full scale 240 at the default bias 7), ``extension/ops.py`` (``FP8_MAX`` = 240 on
  Gaudi 2; ``per_tensor_dequantize``: "dequant on cpu to avoid nan on gaudi2";
  ``gaudi_weight_wrapper``: every e4m3fn weight loaded on Gaudi 2 is halved *in float8_e4m3fn*
  and its scale doubled, which is right only if the card reads the halved bytes at their
  float8_e4m3fn value); ``ops/hpu_compressed_tensors.py``'s scale-adjustment table (448 quantized,
  240 deployed on G2). The Inf / NaN split of the top exponent follows IEEE-754 (third party,
  SqueezeBits "[Intel Gaudi] #4. FP8 Quantization": "E4M3 ... exponent bias of 3, 7,
  11, and 15, with 7 as the default, enabling a range from -240 to 240 under the IEEE-754
  standard"). Not the fnuz reinterpretation (bias 8, every value halved, 0x80 NaN): under it
  ``gaudi_weight_wrapper``'s halved weights with doubled scales would come out half their value.
* **Gaudi 3** reads float8_e4m3fn as OCP E4M3 (448; NaN only at ``0x7f`` / ``0xff``): PyTorch's
  own reading. Other FP8 dtypes (e5m2, the fnuz types) are read as PyTorch reads them on both
  cards (not modelled further).

Writing: a cast with these kernels saturates at the card's largest finite value (240 on Gaudi 2
whichever e4m3 dtype is requested; assumed: a plain ``.to(float8)`` in PyTorch gives NaN / inf
past it); a plain ``.to(torch.float8_e4m3fn)`` on a card tensor is the CPU's cast (not modelled),
whose codes the card then reads as above. Rounding is round-to-nearest-even (PyTorch's cast).
Not emulated (NotImplementedError): ``stochastic_rounding=True``, ``scale_shape`` (block
scales in the casts) and block-wise scales in the GEMM. The dtype a cast without ``dtype`` gives
(``config.Card.fp8_e4m3``) is an assumption: every vllm-gaudi call site names float8_e4m3fn.
"""

from __future__ import annotations

import torch

from ..config import card

E4M3 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FP8_DTYPES = (*E4M3, torch.float8_e5m2, torch.float8_e5m2fnuz)
GAUDI2_E4M3_MAX = 240.0


#: the e4m3 codes Gaudi 2 cannot hold: exponent field 1111 (bits 6-3 of the byte)
GAUDI2_TOP_EXPONENT = 0x78


def card_reads_differently(dtype: torch.dtype) -> bool:
    """Whether the emulated card reads stored ``dtype`` bytes otherwise than PyTorch does."""
    return dtype == torch.float8_e4m3fn and card().name == "gaudi2"


def card_read(x: torch.Tensor) -> torch.Tensor:
    """Float32 values of ``x`` as the emulated card reads its stored bytes (module docstring).

    On Gaudi 2 a float8_e4m3fn code with the top exponent reads as +-inf (mantissa 000) or NaN;
    every other tensor is ``x.float()``."""
    if not card_reads_differently(x.dtype):
        return x.float()
    code = x.view(torch.uint8)
    top = (code & GAUDI2_TOP_EXPONENT) == GAUDI2_TOP_EXPONENT
    values = x.float()
    inf = torch.where(code >= 0x80, float("-inf"), float("inf"))
    special = torch.where((code & 0x07) == 0, inf, float("nan"))
    return torch.where(top, special, values)


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite magnitude a cast to ``dtype`` produces on the emulated card."""
    if dtype in E4M3 and card().name == "gaudi2":
        return GAUDI2_E4M3_MAX
    return float(torch.finfo(dtype).max)


def fp8_quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Saturating cast of (already scaled) ``x`` to the FP8 ``dtype``."""
    if dtype not in FP8_DTYPES:
        raise NotImplementedError(f"FP8 emulation: cast to {dtype}")
    lim = fp8_max(dtype)
    return x.float().clamp(-lim, lim).to(dtype)


def _resolve_dtype(dtype: torch.dtype | None) -> torch.dtype:
    return card().fp8_e4m3 if dtype is None else dtype


def cast_to_fp8_v2(
    input: torch.Tensor,
    scale=None,
    stochastic_rounding: bool = False,
    is_amax: bool = False,
    dtype: torch.dtype | None = None,
    scale_shape=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(saturate(input * scale) as dtype, amax)``; amax = max|input| (float32, 0-d) if is_amax else empty.

    ``dtype`` None means the card's e4m3 (``config.card().fp8_e4m3``).
    """
    if stochastic_rounding:
        raise NotImplementedError("cast_to_fp8_v2 emulation: stochastic_rounding=True")
    if scale_shape is not None:
        raise NotImplementedError("cast_to_fp8_v2 emulation: scale_shape (block scales)")
    dtype = _resolve_dtype(dtype)
    x = input.float()
    if scale is not None:
        x = x * (scale.float() if isinstance(scale, torch.Tensor) else float(scale))
    amax = input.float().abs().amax() if is_amax else x.new_empty(0)
    return fp8_quantize(x, dtype), amax


def cast_from_fp8(input: torch.Tensor, scale=None, out_dtype: torch.dtype = torch.bfloat16, scale_shape=None):
    """``input * scale`` in ``out_dtype`` (scale per tensor or broadcastable, or None for 1)."""
    if scale_shape is not None:
        raise NotImplementedError("cast_from_fp8 emulation: scale_shape (block scales)")
    x = card_read(input)
    if scale is not None:
        x = x * (scale.float() if isinstance(scale, torch.Tensor) else float(scale))
    return x.to(out_dtype)


def _a_scale(s, a: torch.Tensor):
    if s is None:
        return 1.0
    if not isinstance(s, torch.Tensor):
        return float(s)
    s = s.float()
    if s.numel() == 1:
        return s.reshape(())
    if s.dim() >= 1 and s.shape[-1] == 1:
        return s  # per row [..., M, 1]
    raise NotImplementedError(f"fp8_gemm_v2 emulation: A_scale_inv of shape {tuple(s.shape)} (block scales)")


def _b_scale(s, n: int):
    if s is None:
        return 1.0
    if not isinstance(s, torch.Tensor):
        return float(s)
    s = s.float()
    if s.numel() == 1:
        return s.reshape(())
    if s.numel() == n and (s.dim() == 1 or s.shape[-1] == 1 or s.shape[-1] == n):
        return s.reshape(n)  # per output channel
    raise NotImplementedError(f"fp8_gemm_v2 emulation: B_scale_inv of shape {tuple(s.shape)} (block scales)")


def fp8_gemm_v2(
    A: torch.Tensor,
    trans_A: bool,
    B: torch.Tensor,
    trans_B: bool,
    D: torch.Tensor | None,
    out_dtype: torch.dtype,
    A_scale_inv=None,
    B_scale_inv=None,
    bias: torch.Tensor | None = None,
    accumulate: bool = False,
    B_scale_shape=None,
) -> torch.Tensor:
    """``(op(A) @ op(B)) * A_scale_inv * B_scale_inv (+ bias) (+ D if accumulate)`` in out_dtype.

    ``op`` transposes the last two dims when ``trans_*``. A's scale: per tensor or per row
    (``[..., M, 1]``); B's scale: per tensor or per output column (N values). Accumulates in
    float32 (exact products of FP8 values).
    """
    if B_scale_shape is not None:
        raise NotImplementedError("fp8_gemm_v2 emulation: B_scale_shape (block scales)")
    a = card_read(A)
    b = card_read(B)
    if trans_A:
        a = a.transpose(-1, -2)
    if trans_B:
        b = b.transpose(-1, -2)
    out = torch.matmul(a, b)
    out = out * _a_scale(A_scale_inv, a) * _b_scale(B_scale_inv, out.shape[-1])
    if bias is not None:
        out = out + bias.float()
    if accumulate and D is not None:
        out = out + D.float()
    return out.to(out_dtype)
