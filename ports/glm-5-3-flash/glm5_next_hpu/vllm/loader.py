"""Checkpoint key -> exactly one parameter, completeness checked on bytes written.

vllm-gaudi's synced weight loader drops the inner loader's return value, so a completeness
check built on ``return_success`` mis-reports every expert. This loader therefore
never trusts a return value: it computes the destination region of every tensor itself,
copies into it, and counts the elements written per parameter. After the stream ends:

* a parameter written fewer elements than it holds -> error naming the checkpoint keys that
  were expected for it and never arrived;
* written more (two keys hitting one region, or a duplicate key) -> error naming the key;
* an unknown key, or a tensor whose shape (after the parameter's reshape rule) does not fit
  its region -> error naming the key, the checkpoint shape and the parameter shape.

Sharding rules travel on the parameters (set by the model at construction):

* ``glm5_view``: reshape the *whole* checkpoint tensor before sharding. The flat ``A_log`` [H]
  becomes [1, 1, H, 1] and is then sharded on dim 2 -- sharding first fails at TP 8 and
  silently works at TP 1, so a TP 1 test would hide it.
* ``glm5_shard_dim``: the dim split across tensor-parallel ranks (None = replicated).
* ``glm5_fused``: {checkpoint suffix: (row offset, rows)} for a parameter fused from several
  checkpoint tensors (the HPU MLA path's fused q_a / kv_a projection).
* ``glm5_experts``: (first global expert id, count, all experts) of a stacked expert parameter. With
  expert parallelism a rank holds a slice of the experts; the other ranks' expert keys are reported
  in ``other_rank_keys`` (loaded there), not loaded here and not counted as skipped.

Block-FP8 checkpoints (``fp8=BlockFp8Spec``; ``fp8.py``): each FP8 ``<module>.weight`` is paired
with its ``<module>.weight_scale_inv`` *before* the region logic above; the pairing refuses, naming
the key, an unpaired weight or scale, a scale off the block grid, a duplicate, and an FP8 tensor of
a module in modules_to_not_convert. What the pair becomes depends on the weight's parameter:

* a parameter in the model dtype (the CPU reference path's projections; on every path the indexer
  and the HPU MLA's fused q_a/kv_a projection): the weight is dequantized with its scale, and the
  byte count checks the dequantized weight like any other;
* an FP8 parameter (vLLM's FP8 linear method created it, with its ``weight_scale_inv`` beside it; or
  the routed experts' stacked ``w13_weight`` / ``w2_weight`` with ``w13_weight_scale_inv`` /
  ``w2_weight_scale_inv``, gate and up scale block rows stacked like their weights' rows):
  the e4m3 weight and the fp32 scale are both loaded as they are, each narrowed to the rank's
  region (the scale's block rows or columns with the weight's rows or columns) and counted like
  any other parameter, so each byte of either lands exactly once. They go through the parameter's
  ``weight_loader`` (the layer's copy, which vllm-gaudi wraps on Gaudi2 to rescale e4m3fn for its
  smaller FP8 range). A non-FP8 tensor for an FP8 parameter is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from ..weights import map_checkpoint_key
from .fp8 import FP8_DTYPE, BlockFp8Spec, Fp8Pairing

#: the rules above, and vLLM's own ``weight_loader``: the only attributes ``mark`` sets
RULES = frozenset({"glm5_view", "glm5_shard_dim", "glm5_fused", "glm5_experts", "glm5_weight_loader", "weight_loader"})
_T = TypeVar("_T", bound=torch.Tensor)


def mark(param: _T, **rules: object) -> _T:
    """Attach sharding rules to ``param`` (as vLLM's set_weight_attrs does: attributes on the tensor)."""
    unknown = sorted(set(rules) - RULES)
    if unknown:
        raise ValueError(f"unknown parameter rule(s) {unknown}; known: {sorted(RULES)}")
    for name, value in rules.items():
        setattr(param, name, value)
    return param


class CheckpointLoadError(ValueError):
    """A checkpoint key or parameter did not load exactly once; the message names it."""


@dataclass
class LoadReport:
    loaded_keys: set[str] = field(default_factory=set)
    skipped_keys: list[str] = field(default_factory=list)
    loaded_params: set[str] = field(default_factory=set)
    elements: int = 0
    fp8_dequantized: list[str] = field(default_factory=list)  # FP8 weight keys, each with its scale consumed
    fp8_raw: list[str] = field(default_factory=list)  # FP8 weight keys loaded as FP8, each with its scale
    other_rank_keys: list[str] = field(default_factory=list)  # experts placed on another EP rank


def _region(dest: torch.Tensor, tensor: torch.Tensor, key: str, param, name: str, tp_rank: int, tp_size: int):
    view = getattr(param, "glm5_view", None)
    if view is not None:
        try:
            tensor = tensor.reshape(view)
        except RuntimeError:
            raise CheckpointLoadError(
                f"{key}: checkpoint shape {tuple(tensor.shape)} cannot be viewed as {tuple(view)} for {name}"
            ) from None
    dim = getattr(param, "glm5_shard_dim", None)
    if dim is not None and tp_size > 1:
        if dim >= tensor.dim():
            raise CheckpointLoadError(
                f"{key}: checkpoint shape {tuple(tensor.shape)} has no dim {dim} to shard for {name} "
                f"{tuple(param.shape)} (a flat tensor must be reshaped before sharding)"
            )
        if tensor.shape[dim] % tp_size:
            raise CheckpointLoadError(f"{key}: dim {dim} of {tuple(tensor.shape)} is not divisible by TP {tp_size}")
        size = tensor.shape[dim] // tp_size
        tensor = tensor.narrow(dim, tp_rank * size, size)
    return tensor


def expected_keys(param_name: str, param, num_experts: int | None = None) -> list[str]:
    """The checkpoint keys that together fill ``param_name``."""
    fused = getattr(param, "glm5_fused", None)
    if fused:
        stem = param_name.rsplit(".", 2)[0]
        return [f"{stem}.{suffix}" for suffix in fused]
    m = re.match(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<w>w13_weight|w2_weight)(?P<scale>_scale_inv)?$", param_name)
    if m:
        projs = ("gate_proj", "up_proj") if m.group("w") == "w13_weight" else ("down_proj",)
        start, n, _ = getattr(param, "glm5_experts", (0, param.shape[0], param.shape[0]))
        if num_experts is not None:
            start, n = 0, num_experts
        suffix = "weight" + (m.group("scale") or "")
        return [f"{m.group('prefix')}.{e}.{p}.{suffix}" for e in range(start, start + n) for p in projs]
    return [param_name]


@torch.no_grad()
def load_checkpoint(
    model: torch.nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    num_hidden_layers: int,
    tp_rank: int = 0,
    tp_size: int = 1,
    skip: Callable[[str], bool] | None = None,
    rename: Callable[[str], str] | None = None,
    fp8: BlockFp8Spec | None = None,
) -> LoadReport:
    """Load (checkpoint key, tensor) pairs into ``model``; raise :class:`CheckpointLoadError` unless
    every parameter received exactly its number of elements and every key landed exactly once.

    ``skip(key)`` marks keys deliberately not served (e.g. the vision tower with
    GLM5_NEXT_VISION=0); MTP layers are skipped as transformers does. ``rename`` maps a checkpoint
    key to the model's parameter naming, when they differ. ``fp8``: the checkpoint's block-FP8
    quantization_config (None: a BF16 checkpoint, and any FP8 tensor or scale in it is refused).
    """
    params = dict(model.named_parameters())
    fused_owner = {}
    for name, p in params.items():
        for suffix in getattr(p, "glm5_fused", None) or ():
            fused_owner[f"{name.rsplit('.', 2)[0]}.{suffix}"] = name
    written = dict.fromkeys(params, 0)
    report = LoadReport()
    pairing = Fp8Pairing(fp8, lambda key: _fp8_dest_dtype(key, params, fused_owner, num_hidden_layers, skip, rename))
    for raw_key, raw_tensor in weights:
        for key, tensor in pairing.feed(raw_key, raw_tensor):
            _load_one(
                key, tensor, params, fused_owner, written, report, num_hidden_layers, tp_rank, tp_size, skip, rename
            )
    pairing.finish()
    report.fp8_dequantized = list(pairing.dequantized)
    report.fp8_raw = list(pairing.raw)
    missing_params = [n for n, p in params.items() if written[n] != p.numel()]
    if missing_params:
        lines = []
        for n in missing_params:
            keys = [k for k in expected_keys(n, params[n]) if k not in report.loaded_keys]
            lines.append(
                f"{n}: {written[n]} of {params[n].numel()} elements; missing {keys[:8]}{' ...' if len(keys) > 8 else ''}"
            )
        raise CheckpointLoadError(f"{len(missing_params)} parameters not fully loaded:\n  - " + "\n  - ".join(lines))
    report.loaded_params = set(params)
    return report


def _param_name(key, target, params, fused_owner, rename) -> str:
    pname = rename(target.param) if rename else target.param
    if pname not in params and key in fused_owner:
        pname = fused_owner[key]
    return pname


def _fp8_dest_dtype(key, params, fused_owner, num_hidden_layers, skip, rename) -> torch.dtype:
    """The dtype of the parameter an FP8 weight lands in: the dtype it is dequantized to, or FP8
    (vLLM's FP8 method), and then the bytes and the scale are loaded as they are."""
    target = map_checkpoint_key(key, num_hidden_layers)
    if target is None or (skip is not None and skip(key)):
        return torch.float32  # a skipped key (MTP, vision off): paired and checked, then reported skipped
    pname = _param_name(key, target, params, fused_owner, rename)
    if pname not in params:
        raise CheckpointLoadError(f"{key}: no parameter {pname!r} in the model (unknown checkpoint key)")
    return params[pname].dtype


def _load_one(
    key, tensor, params, fused_owner, written, report, num_hidden_layers, tp_rank, tp_size, skip, rename
) -> None:
    if key in report.loaded_keys:
        raise CheckpointLoadError(f"{key}: appears twice in the checkpoint stream")
    target = map_checkpoint_key(key, num_hidden_layers)
    if target is None or (skip is not None and skip(key)):
        report.skipped_keys.append(key)
        return
    pname = _param_name(key, target, params, fused_owner, rename)
    offset = None
    if pname not in params:
        raise CheckpointLoadError(f"{key}: no parameter {pname!r} in the model (unknown checkpoint key)")
    param = params[pname]
    dest = param.data
    fused = getattr(param, "glm5_fused", None)
    if fused:
        suffix = key[len(pname.rsplit(".", 2)[0]) + 1 :]
        offset, rows = fused[suffix]
        dest = dest.narrow(0, offset, rows)
    src = _region(dest, tensor, key, param, pname, tp_rank, tp_size)
    if target.expert is not None:
        start, count, total = getattr(param, "glm5_experts", (0, dest.shape[0], dest.shape[0]))
        if 0 <= target.expert < total and not start <= target.expert < start + count:
            report.other_rank_keys.append(key)  # expert parallel: another rank's whole expert
            return
        if not 0 <= target.expert - start < dest.shape[0]:
            raise CheckpointLoadError(f"{key}: expert {target.expert} beyond {pname} with {dest.shape[0]} experts")
        dest = dest[target.expert - start]
        half = dest.shape[0] // 2
        if target.shard == "gate":
            dest = dest[:half]
        elif target.shard == "up":
            dest = dest[half:]
    if tuple(dest.shape) != tuple(src.shape):
        raise CheckpointLoadError(
            f"{key}: checkpoint shape {tuple(tensor.shape)} (as loaded {tuple(src.shape)}) != "
            f"parameter {pname} region {tuple(dest.shape)}"
        )
    if (dest.dtype == FP8_DTYPE) != (src.dtype == FP8_DTYPE):
        raise CheckpointLoadError(
            f"{key}: checkpoint dtype {src.dtype} into parameter {pname} of dtype {dest.dtype}; an FP8 parameter "
            "(vLLM's FP8 method) takes only the checkpoint's FP8 bytes (is the module missing from "
            "quantization_config.modules_to_not_convert?)"
        )
    if getattr(param, "glm5_weight_loader", False):
        param.weight_loader(param, src, dest)
    else:
        dest.copy_(src)
    written[pname] += dest.numel()
    if written[pname] > param.numel():
        raise CheckpointLoadError(f"{key}: {pname} written {written[pname]} elements, it holds {param.numel()}")
    report.loaded_keys.add(key)
    report.elements += dest.numel()
