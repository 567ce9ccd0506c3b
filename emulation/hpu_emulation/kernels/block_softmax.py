"""block_softmax and block_softmax_adjustment (paged-attention decode, flat_pa).

Semantics are those of the native branch that the fused ops replace in
``vllm_gaudi/extension/ops.py:pipelined_pa`` (b059f9c); ``flat_pa`` fixes the shapes:

* ``attn, block_max, block_sums = block_softmax(attn, block_bias, block_groups)`` (used only
  when ``attn.dim() == 5``, i.e. ``[blocks, kv_heads, q_heads_per_kv, 1, block_size]``): the
  native branch does ``attn += block_bias``, ``block_max = attn.amax(-1, keepdim=True)``,
  ``attn = exp(attn - block_max)``, ``block_sums = attn.sum(-1, keepdim=True)``; the caller
  casts an fp32 ``attn`` to the value dtype itself, so the op returns attn's dtype.
* ``rescale = block_softmax_adjustment(block_max, block_sums, block_groups, batch_size,
  out_shape)`` with ``out_shape = attn.shape[:3] + [1] * (attn.dim() - 3)`` replaces:
  ``group_max`` = max of ``block_max`` over the blocks of the same sequence (``grouped_max``:
  ``batch_size + 1`` slots so that padding blocks, whose group is ``batch_size``, share one),
  ``adj = exp(block_max - group_max)``, ``sum_adj = block_sums * adj``, ``group_sum`` = sum of
  ``sum_adj`` over the sequence's blocks (``block2batch`` then ``batch2block`` with the one-hot
  ``block_mapping``, in which padding blocks map to no sequence and get 0),
  ``rescale = adj / maximum(group_sum, sum_adj)``.

Assumed: ``block_groups`` carries the same sequence ids as ``block_mapping`` (ids
``>= batch_size`` are padding), and the fused block_softmax uses the per-block maximum like the
native branch (any per-group shift gives the same final attention, as the adjustment cancels it).
Computed in float32, returned in the inputs' dtypes.
"""

from __future__ import annotations

import torch


def block_softmax(
    attn: torch.Tensor, block_bias: torch.Tensor | None, block_groups: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(exp(attn + bias - block_max), block_max, block_sums)``, the last two ``[..., 1]``."""
    a = attn.float()
    if block_bias is not None:
        a = a + block_bias.float()
    block_max = a.amax(dim=-1, keepdim=True)
    # A fully masked block (all -inf) would give NaN; shift it by 0 so it sums to 0.
    shift = torch.where(torch.isneginf(block_max), torch.zeros_like(block_max), block_max)
    e = torch.exp(a - shift)
    sums = e.sum(dim=-1, keepdim=True)
    return e.to(attn.dtype), block_max.to(attn.dtype), sums.to(attn.dtype)


def block_softmax_adjustment(
    block_max: torch.Tensor,
    block_sums: torch.Tensor,
    block_groups: torch.Tensor,
    batch_size: int,
    out_shape,
) -> torch.Tensor:
    """Per-block rescale factor ``adj / group_sum``, shaped ``out_shape``, in block_max's dtype."""
    bm = block_max.float().reshape(block_max.shape[0], -1)
    bs = block_sums.float().reshape(block_sums.shape[0], -1)
    groups = block_groups.to(torch.int64).reshape(-1)
    slots = batch_size + 1
    group_max = torch.full((slots, bm.shape[1]), float("-inf"), dtype=torch.float32, device=bm.device)
    slot = groups.clamp(max=batch_size)
    group_max = group_max.scatter_reduce(0, slot.unsqueeze(1).expand_as(bm), bm, "amax")
    gmax = group_max.index_select(0, slot)
    adj = torch.exp(bm - gmax)
    sum_adj = bs * adj
    real = (groups < batch_size).unsqueeze(1)
    group_sum = torch.zeros((slots, bm.shape[1]), dtype=torch.float32, device=bm.device)
    group_sum = group_sum.index_add(0, slot, torch.where(real, sum_adj, 0.0))
    gsum = torch.where(real, group_sum.index_select(0, slot), 0.0)
    rescale = adj / torch.maximum(gsum, sum_adj)
    return rescale.reshape(list(out_shape)).to(block_max.dtype)
