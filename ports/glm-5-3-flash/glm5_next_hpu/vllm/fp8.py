"""Block-FP8 checkpoints (DeepSeek-V3 style): e4m3 weights with one fp32 inverse scale per block.

The published GLM-5.3-Flash checkpoint stores the MLA and MLP/expert projections as
``<module>.weight`` (float8_e4m3fn) plus ``<module>.weight_scale_inv`` (fp32, one value per
``weight_block_size`` block, the grid rounded up at the edges), and says so in config.json's
``quantization_config`` (quant_method fp8, fmt e4m3, weight_block_size, activation_scheme dynamic,
modules_to_not_convert). The stored value is ``w / scale`` with ``scale_inv = 1 / scale``, so the
weight is recovered by *multiplying* by ``scale_inv`` -- transformers' ``Fp8Dequantize``:
``(fp8.to(float32) * scale_inv.to(float32)).to(dtype)``. :func:`dequantize_block_fp8` does exactly
that (one fp32 product per element, one rounding to the model dtype), so its result is the same
bits as transformers' for the same dtype (tested).

This module holds no vLLM import: the spec, the (de)quantization and :class:`Fp8Pairing`, which
the plugin's loader runs over the checkpoint stream to hand each FP8 weight, paired with its
scale, either dequantized to the parameter's dtype (the CPU reference path, and on every path the
layers that stay in the model dtype) or as the raw e4m3 bytes and fp32 scale for a parameter that
vLLM's FP8 linear method created (the HPU path).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
SCALE_SUFFIX = "_scale_inv"  # "<module>.weight" -> "<module>.weight_scale_inv"


class Fp8CheckpointError(ValueError):
    """A block-FP8 tensor or scale did not pair, fit or belong; the message names the key."""


@dataclass(frozen=True)
class BlockFp8Spec:
    """The checkpoint's ``quantization_config``, checked."""

    block: tuple[int, int]  # (rows, cols) of one scale block
    modules_to_not_convert: tuple[str, ...] = ()

    @classmethod
    def from_quantization_config(cls, qc: dict, source: str = "config.json") -> BlockFp8Spec:
        """Accept only what the plugin implements: fp8, e4m3, 2-D blocks, dynamic activations."""
        where = f"{source}: quantization_config"
        if not isinstance(qc, dict):
            raise Fp8CheckpointError(f"{where} is {type(qc).__name__}, not an object")
        if qc.get("quant_method") != "fp8":
            raise Fp8CheckpointError(f"{where}.quant_method is {qc.get('quant_method')!r}, not 'fp8'")
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise Fp8CheckpointError(f"{where}.fmt is {fmt!r}; only e4m3 (float8_e4m3fn) is implemented")
        if qc.get("activation_scheme", "dynamic") != "dynamic":
            raise Fp8CheckpointError(f"{where}.activation_scheme is {qc.get('activation_scheme')!r}; only 'dynamic'")
        if qc.get("scale_fmt", "float") != "float":
            raise Fp8CheckpointError(f"{where}.scale_fmt is {qc.get('scale_fmt')!r}; only fp32 scales ('float')")
        block = qc.get("weight_block_size")
        if not (
            isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
        ):
            raise Fp8CheckpointError(
                f"{where}.weight_block_size is {block!r}; need two positive ints (per-block scales)"
            )
        skip = qc.get("modules_to_not_convert", qc.get("ignored_layers")) or []
        if not (isinstance(skip, list) and all(isinstance(s, str) for s in skip)):
            raise Fp8CheckpointError(f"{where}.modules_to_not_convert must be a list of module names")
        return cls(block=(block[0], block[1]), modules_to_not_convert=tuple(skip))

    def to_quantization_config(self) -> dict:
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(self.block),
            "modules_to_not_convert": list(self.modules_to_not_convert),
        }

    def skipped(self, module: str) -> bool:
        """Whether ``module`` is in modules_to_not_convert, matched as transformers 5.23.0 does
        (``should_convert_module``): a prefix ending at a module boundary, a regex with that boundary,
        or a suffix. vLLM's exact-name match is the special case the release's full names use."""
        boundary = r"(?:(?<=\.)|(?=\.|$))"
        return any(re.match(rf"(?:{p}){boundary}", module) or module.endswith(p) for p in self.modules_to_not_convert)


def scale_grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    rows, cols = shape
    return (-(-rows // block[0]), -(-cols // block[1]))


def check_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], key: str = "weight") -> None:
    """Refuse, naming the key, a weight that is not 2-D e4m3 or a scale that is not fp32 on its block grid."""
    if weight.dtype != FP8_DTYPE:
        raise Fp8CheckpointError(f"{key}: dtype {weight.dtype}, expected {FP8_DTYPE}")
    if weight.dim() != 2:
        raise Fp8CheckpointError(f"{key}: FP8 weight of shape {tuple(weight.shape)}; block scales need a 2-D weight")
    if scale_inv.dtype != torch.float32:
        raise Fp8CheckpointError(f"{key}{SCALE_SUFFIX}: dtype {scale_inv.dtype}, expected torch.float32")
    grid = scale_grid(tuple(weight.shape), block)
    if tuple(scale_inv.shape) != grid:
        raise Fp8CheckpointError(
            f"{key}{SCALE_SUFFIX}: shape {tuple(scale_inv.shape)} does not match the block grid {grid} of "
            f"weight {tuple(weight.shape)} with weight_block_size {list(block)}"
        )


def dequantize_block_fp8(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype, key: str = "weight"
) -> torch.Tensor:
    """``(weight.float() * scale_inv.float() per block).to(dtype)``; a partial edge block uses its
    block's scale (the grid is rounded up, as DeepSeek-V3 checkpoints and vLLM's block scales are)."""
    check_block_fp8(weight, scale_inv, block, key)
    rows, cols = weight.shape
    s = scale_inv.repeat_interleave(block[0], dim=0)[:rows].repeat_interleave(block[1], dim=1)[:, :cols]
    return (weight.to(torch.float32) * s).to(dtype)


def quantize_block_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block absmax e4m3 quantization: ``scale = 448 / absmax`` (1 for an all-zero block),
    stored ``clamp(w * scale)`` and ``scale_inv = 1 / scale`` (fp32). For the tiny test checkpoint."""
    rows, cols = weight.shape
    gr, gc = scale_grid((rows, cols), block)
    w = torch.zeros(gr * block[0], gc * block[1], dtype=torch.float32)
    w[:rows, :cols] = weight.to(torch.float32)
    tiles = w.view(gr, block[0], gc, block[1])
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.ones_like(amax))
    q = (tiles * scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(gr * block[0], gc * block[1])[:rows, :cols].contiguous(), (1.0 / scale).to(torch.float32)


class Fp8Pairing:
    """Pairs each FP8 ``<module>.weight`` with its ``<module>.weight_scale_inv`` in a checkpoint
    stream (either order, across files) and emits the pair either as one dequantized tensor under
    the weight's key or, when the weight's parameter is itself FP8 (vLLM's FP8 linear method made
    it), as the two raw tensors, weight then scale, checked and unchanged. Every other tensor passes
    through unchanged. Refused, naming the key: an FP8
    tensor that is not a 2-D ``.weight``, or whose module is in modules_to_not_convert; a scale
    that arrives twice, or whose shape is not the weight's block grid; and, at :meth:`finish`, an
    FP8 weight without its scale or a scale without an FP8 weight. With ``spec=None`` (no
    quantization_config) any FP8 tensor or scale is refused.

    ``dtype_for(key)`` is the dtype of the parameter the weight lands in: the model dtype (the
    product is rounded once, from fp32 to it) or ``FP8_DTYPE`` (the bytes and the scale are kept)."""

    def __init__(self, spec: BlockFp8Spec | None, dtype_for: Callable[[str], torch.dtype]):
        self.spec = spec
        self.dtype_for = dtype_for
        self.weights: dict[str, torch.Tensor] = {}
        self.scales: dict[str, torch.Tensor] = {}
        self.seen_scales: set[str] = set()
        self.dequantized: list[str] = []  # weight keys, in the order they were emitted
        self.raw: list[str] = []  # weight keys emitted as FP8 bytes with their scale

    def _no_spec(self, key: str, what: str) -> NoReturn:
        raise Fp8CheckpointError(f"{key}: {what} in a checkpoint whose config.json has no fp8 quantization_config")

    def feed(self, key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if key.endswith(".weight" + SCALE_SUFFIX):
            if self.spec is None:
                self._no_spec(key, "a block-FP8 scale")
            if key in self.seen_scales:
                raise Fp8CheckpointError(f"{key}: scale appears twice in the checkpoint stream")
            self.seen_scales.add(key)
            wkey = key[: -len(SCALE_SUFFIX)]
            if wkey in self.weights:
                return self._pair(wkey, self.weights.pop(wkey), tensor)
            self.scales[wkey] = tensor
            return []
        if tensor.dtype == FP8_DTYPE:
            if self.spec is None:
                self._no_spec(key, f"an {FP8_DTYPE} tensor")
            if not key.endswith(".weight") or tensor.dim() != 2:
                raise Fp8CheckpointError(
                    f"{key}: {FP8_DTYPE} tensor of shape {tuple(tensor.shape)} is not a 2-D projection weight"
                )
            module = key[: -len(".weight")]
            if self.spec.skipped(module):
                raise Fp8CheckpointError(
                    f"{key}: stored as {FP8_DTYPE} but {module} is in quantization_config.modules_to_not_convert"
                )
            if key in self.weights:
                raise Fp8CheckpointError(f"{key}: appears twice in the checkpoint stream")
            if key in self.scales:
                return self._pair(key, tensor, self.scales.pop(key))
            self.weights[key] = tensor
            return []
        return [(key, tensor)]

    def _pair(self, key: str, weight: torch.Tensor, scale_inv: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        assert self.spec is not None
        dtype = self.dtype_for(key)
        if dtype == FP8_DTYPE:
            check_block_fp8(weight, scale_inv, self.spec.block, key)
            self.raw.append(key)
            return [(key, weight), (key + SCALE_SUFFIX, scale_inv)]
        out = dequantize_block_fp8(weight, scale_inv, self.spec.block, dtype, key)
        self.dequantized.append(key)
        return [(key, out)]

    def finish(self) -> None:
        problems = [f"{k}: FP8 weight without its scale {k}{SCALE_SUFFIX}" for k in sorted(self.weights)]
        problems += [
            f"{k}{SCALE_SUFFIX}: scale without an FP8 weight {k} (extra scale, or the weight is not {FP8_DTYPE})"
            for k in sorted(self.scales)
        ]
        if problems:
            raise Fp8CheckpointError(f"{len(problems)} block-FP8 tensors did not pair:\n  - " + "\n  - ".join(problems))
