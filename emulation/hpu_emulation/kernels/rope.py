"""apply_rotary_pos_emb (``habana_frameworks.torch.hpex.kernels``).

Call sites: ``vllm_gaudi/ops/hpu_rotary_embedding.py`` (b059f9c), every ``forward_oot``:
``apply_rotary_pos_emb(x, cos, sin, None, 0, mode)`` with x ``[tokens, heads, rot_dim]`` and
cos/sin ``[tokens, 1, rot_dim]`` already expanded to the full rotary width by
``prepare_cos_sin``: ``cat((cos, cos))`` for ``BLOCKWISE`` (GPT-NeoX, rotate halves) and
``repeat_interleave(cos, 2)`` for ``PAIRWISE`` (GPT-J, interleaved pairs), as its comments say.
So ``out = x * cos + rotate(x) * sin`` with

* BLOCKWISE: ``rotate(x) = cat(-x[..., d/2:], x[..., :d/2])``,
* PAIRWISE:  ``rotate(x)[2i] = -x[2i + 1]``, ``rotate(x)[2i + 1] = x[2i]``.

Assumed: computed in float32, rounded to x's dtype. Not emulated (NotImplementedError):
``position_ids`` other than None and ``offset`` other than 0 (never passed by vllm-gaudi).
"""

from __future__ import annotations

import enum

import torch


class RotaryPosEmbeddingMode(enum.IntEnum):
    BLOCKWISE = 0
    PAIRWISE = 1


def _rotate(x: torch.Tensor, mode: int) -> torch.Tensor:
    if mode == RotaryPosEmbeddingMode.BLOCKWISE:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    if mode == RotaryPosEmbeddingMode.PAIRWISE:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    raise NotImplementedError(f"apply_rotary_pos_emb emulation: mode {mode!r}")


def rotary_pos_embedding(
    input: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    offset: int = 0,
    mode: int = RotaryPosEmbeddingMode.BLOCKWISE,
) -> torch.Tensor:
    """``input * cos + rotate(input) * sin`` (cos/sin broadcast against input)."""
    if position_ids is not None:
        raise NotImplementedError("apply_rotary_pos_emb emulation: position_ids (cos/sin must be pre-gathered)")
    if offset != 0:
        raise NotImplementedError(f"apply_rotary_pos_emb emulation: offset={offset}")
    if input.shape[-1] % 2:
        raise ValueError(f"rotary dim {input.shape[-1]} is odd")
    x = input.float()
    out = x * cos.float() + _rotate(x, int(mode)) * sin.float()
    return out.to(input.dtype)
