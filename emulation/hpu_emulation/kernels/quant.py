"""convert_from_uint4: int4 (GPTQ / AWQ / compressed-tensors wNa16) weights to a dense matrix.

Call sites (b059f9c): ``vllm_gaudi/ops/hpu_gptq.py:GPTQHPULinearMethod.apply``,
``ops/hpu_awq.py:AWQHPULinearMethod.apply``, ``ops/hpu_compressed_tensors.py`` (wNa16) and
``extension/ops.py:MoeWNA16Matmul.get_dequant_weight``:
``weight = convert_from_uint4(qweight, scales, qzeros, out_dtype[, g_idx])`` followed by
``x @ weight``, so the result is ``[in_features, out_features]``. The layouts come from the
repacking done at load time in those files (``pack_tensor``): ``qweight`` int32
``[in, out / 8]`` and ``qzeros`` int32 ``[groups, out / 8]`` hold eight 4-bit values per word
along the last dim, value ``j`` at bits ``4j .. 4j + 3`` (lowest first); ``scales``
``[groups, out]``; GPTQ's "+1" zero-point quirk is already undone there, so

    weight[k, n] = (q[k, n] - z[g(k), n]) * scales[g(k), n]

with ``g(k) = g_idx[k]`` when given, else ``k // (in / groups)``.
Assumed: the subtraction and product are exact in float32, rounded once to out_dtype.
"""

from __future__ import annotations

import torch


def unpack_uint4(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., n / 8]`` -> int32 ``[..., n]``, value j of a word at bits 4j..4j+3."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    vals = torch.bitwise_right_shift(packed.to(torch.int32).unsqueeze(-1), shifts) & 0xF
    return vals.flatten(-2)


def convert_from_uint4(
    input: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    out_dtype: torch.dtype,
    g_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    q = unpack_uint4(input).float()
    rows, cols = q.shape[-2], q.shape[-1]
    if scale.shape[-1] != cols:
        raise ValueError(f"scale {tuple(scale.shape)} does not match unpacked weight [{rows}, {cols}]")
    groups = scale.shape[-2]
    if g_idx is None:
        if rows % groups:
            raise ValueError(f"{rows} rows are not a multiple of {groups} groups")
        gi = torch.arange(rows, device=q.device) // (rows // groups)
    else:
        gi = g_idx.to(torch.int64)
    if zero_point is None:
        # Every call site passes zero points (compressed-tensors builds them); none is not emulated.
        raise NotImplementedError("convert_from_uint4 emulation: zero_point=None")
    z = unpack_uint4(zero_point).float()[..., :cols].index_select(-2, gi)
    s = scale.float().index_select(-2, gi)
    return ((q - z) * s).to(out_dtype)
