"""GLM-5.3 on vllm-gaudi's platform (registered by glm5_hpu/vllm_plugin.py when the platform is HPU).

vLLM has the model (``GlmMoeDsaForCausalLM``, its MTP draft ``DeepSeekMTP``) and vllm-gaudi
serves it: its MLA backend (DSA layers as dense MLA, the indexer built and never run:
vllm_gaudi/attention/oot_mla.py; with GLM_DSA_SPARSE=1 above the threshold, the port's top-k as an
attention bias on it, glm5_hpu/hpu_dsa.py), and, with the port's patches mxfp4-quant-on-hpu and
mxfp4-moe-non-gpt-oss, the MXFP4 routed experts through vllm-gaudi's own MXFP4 MoE op
(``VllmMixtureOfExpertsOpMXFP4``, fed expert by expert, the expert-parallel shift included).
What the port adds here:

* the router keys vLLM reads and transformers' config lacks (glm5_hpu/router_config.py), filled
  before the model is built, on the target and on the MTP draft;
* the switches, checked at start-up: a switch whose requested path is not built on HPU stops the
  engine with a message naming the switch and what to set, instead of serving another path than
  the launch asked for (glm5_hpu/hpu_launch.py);
* GLM_MOE_TP=N: the MoE layers built with expert groups of N cards (glm5_hpu/hpu_moe.py
  ``group_layout``, put in place of vLLM's MoE parallel config while the model is built);
* GLM_MOE_PLACEMENT: the experts stored in the file's order, the router's ids mapped to the
  slots on the card (glm5_hpu/hpu_moe.py ``placed_loader``, ``PlacedMoEOp``);
* with MTP, the decode levers: greedy rejection on the card (GLM_SPEC_DEVICE_REJECT,
  glm5_hpu/spec_device.py) and the draft launched before the step's tokens are read back
  (GLM_EARLY_DRAFT, glm5_hpu/early_draft.py).

What each switch means on this platform: glm5_hpu/hpu_launch.py.
"""

from __future__ import annotations

import contextlib
import logging

from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.fused_moe import layer as fused_moe_layer
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4Config
from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP
from vllm.model_executor.models.deepseek_v2 import GlmMoeDsaForCausalLM

from . import early_draft, hpu_dsa, placement, spec_device
from .hpu_launch import hpu_not_built
from .hpu_moe import PlacedMoEOp, group_layout, placed_loader
from .hpu_mxk import GlmMxkMoEOp, kernels
from .router_config import fill_router_defaults
from .switches import SwitchError, Switches, read_switches, resolve_auto

#: quantization_config["converter"] starts with this for the port's checkpoints
CONVERTER = "glm5_mxfp4"

# a child of vLLM's "vllm" logger, whose handler vLLM configures: under our own name the lines
# never reached a server's log
logger = logging.getLogger(f"vllm.{__name__}")


def check_launch(vllm_config) -> Switches:
    """The switches of this launch, or SwitchError listing every one that cannot be served."""
    switches = read_switches()
    wants_kernels = resolve_auto(switches.mxk, on_hpu=True) or resolve_auto(switches.mxk_prefill, on_hpu=True)
    found = kernels() if wants_kernels else None
    config = vllm_config.model_config.hf_config
    parallel = vllm_config.parallel_config
    problems = hpu_not_built(
        switches,
        max_model_len=vllm_config.model_config.max_model_len,
        speculative=vllm_config.speculative_config is not None,
        kernels_missing=found if isinstance(found, str) else None,
        threshold=hpu_dsa.threshold(),
        shared_indexer_layers=[i for i, t in enumerate(getattr(config, "indexer_types", None) or []) if t == "shared"],
        tensor_parallel=parallel.tensor_parallel_size,
        expert_parallel=parallel.enable_expert_parallel,
        data_parallel=parallel.data_parallel_size,
        hf_config=config,
    )
    if problems:
        raise SwitchError("glm5_hpu on HPU cannot serve this launch as asked:\n  " + "\n  ".join(problems))
    return switches


def _fill(*model_configs) -> None:
    for mc in model_configs:
        if mc is None:
            continue
        for config in {id(c): c for c in (mc.hf_config, mc.hf_text_config)}.values():
            filled = fill_router_defaults(config)
            if filled:
                logger.info("glm5_hpu: router keys %s filled for glm_moe_dsa", ", ".join(filled))


def _building(model, switches: Switches | None = None) -> None:
    """One line in the server's log naming the port's class being built (and the launch's switches):
    what an operator (and the OpenAI-server test) reads to know the port's HPU model serves."""
    cls = type(model)
    logger.info("glm5_hpu: building %s:%s%s", cls.__module__, cls.__qualname__, f", {switches}" if switches else "")


@contextlib.contextmanager
def moe_groups(moe_tp: int):
    """While the model is built: each MoE layer's parallel config made GLM_MOE_TP's (vLLM's
    FusedMoEFactory looks ``make_parallel_config`` up in its module at each layer; restored after,
    so nothing else built in this process gets the layout)."""
    if moe_tp == 1:
        yield
        return
    stock = fused_moe_layer.make_parallel_config

    def make_parallel_config(*args, **kwargs):
        return group_layout(stock(*args, **kwargs), moe_tp)

    fused_moe_layer.make_parallel_config = make_parallel_config
    try:
        yield
    finally:
        fused_moe_layer.make_parallel_config = stock


class GlmMoeDsaHpuForCausalLM(GlmMoeDsaForCausalLM):
    """vLLM's GlmMoeDsaForCausalLM with glm_moe_dsa's router keys and the launch's switches checked."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        switches = check_launch(vllm_config)
        _building(self, switches)
        _fill(vllm_config.model_config)
        with moe_groups(switches.moe_tp):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        threshold = hpu_dsa.threshold()
        if switches.dsa_sparse and vllm_config.model_config.max_model_len > threshold:
            layers = hpu_dsa.install(self, vllm_config.model_config.hf_config, threshold)
            if layers == 0:
                raise SwitchError("GLM_DSA_SPARSE=1: the model built no DSA indexer (is index_topk in config.json?)")
            logger.info("glm5_hpu: DSA top-k in %d MLA layers above %d keys", layers, threshold)
        if vllm_config.speculative_config is not None and switches.spec_device_reject:
            spec_device.install()  # vllm-gaudi's sampler module is imported by now: ours is installed last
        if vllm_config.speculative_config is not None and switches.early_draft:
            early_draft.install()


class GlmMoeDsaHpuMTP(DeepSeekMTP):
    """vLLM's DeepSeekMTP (the draft for glm_moe_dsa off CUDA: vLLM 0.27.0 names it
    ``DeepSeekMTPModel``, vLLM 0.30.0 ``DeepseekV32MTPModel``, the plugin registers this class for
    both) with the router keys filled, its MoE layer laid out as the target's (GLM_MOE_TP) and its
    residual kept in shape (:func:`residual_shaped`); any other DeepSeek-style MTP is built so too."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        spec = vllm_config.speculative_config
        _building(self)
        _fill(vllm_config.model_config, spec.draft_model_config if spec is not None else None)
        with moe_groups(read_switches().moe_tp):  # the draft's MoE layer laid out as the target's
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        for layer in self.model.layers.values():
            residual_shaped(layer.mtp_block)


def residual_shaped(block) -> None:
    """The MTP layer's decoder block returns its output in the residual's shape.

    vLLM's DeepSeekMultiTokenPredictorLayer adds the block's (hidden, residual) itself:
    ``residual + hidden_states``. On vllm-gaudi the drafter feeds [rows, 1, hidden] (3-D), the
    residual keeps that shape while the block's output comes back [rows, hidden] (vllm-gaudi's fused
    RMSNorm adds its input reshaped to the residual's shape and returns it in the input's own shape;
    the attention and MoE work on [rows, hidden]), so the sum broadcasts to [rows, rows, hidden] and,
    flattened, the draft's row i reads row 0's residual (i < rows). Inside the target model the pair
    only meets in that RMSNorm, which reshapes; here it is reshaped as there."""
    forward = block.forward

    def shaped(*args, **kwargs):
        hidden, residual = forward(*args, **kwargs)
        return hidden.reshape(residual.shape), residual

    block.forward = shaped


# ------------------------------------------------------------------ GLM_MXK / GLM_MXK_PREFILL
class Glm5Mxfp4HpuConfig(Mxfp4Config):
    """vLLM's Mxfp4Config; the routed experts of a checkpoint the glm5_mxfp4 converter wrote get
    vllm-gaudi's MXFP4 MoE method (the port's patch mxfp4-moe-non-gpt-oss) with the GLM kernels
    dispatched by call size when GLM_MXK / GLM_MXK_PREFILL ask for them (glm5_hpu/hpu_mxk.py).
    Any other mxfp4 checkpoint is vLLM's and vllm-gaudi's as before."""

    def __init__(self, ignored_layers=None, glm5_converter: str | None = None):
        super().__init__(ignored_layers)
        self.glm5_converter = glm5_converter

    @classmethod
    def from_config(cls, config):
        conv = config.get("converter")
        return cls(glm5_converter=conv if isinstance(conv, str) and conv.startswith(CONVERTER) else None)

    def get_quant_method(self, layer, prefix: str):
        method = super().get_quant_method(layer, prefix)
        if self.glm5_converter and isinstance(layer, RoutedExperts):
            path = read_switches().moe_placement
            layer_id = _layer_id(prefix)
            if path is not None and layer_id is not None:
                config = get_current_vllm_config().model_config.hf_config
                order = placement.load(path, config).order(layer_id)  # checked at start-up already
                if order != list(range(len(order))):
                    _place(method, placement.slots(order))
        return method

    def _make_moe_method(self, moe):
        method = super()._make_moe_method(moe)
        if self.glm5_converter:
            switches = read_switches()
            decode = resolve_auto(switches.mxk, on_hpu=True)
            prefill = resolve_auto(switches.mxk_prefill, on_hpu=True)
            if decode or prefill:
                _dispatch_kernels(method, decode=decode, prefill=prefill)
        return method


def _dispatch_kernels(method, *, decode: bool, prefill: bool) -> None:
    """After vllm-gaudi's weight set-up of ``method`` (its stock MXFP4 op in ``layer.moe_op``), wrap
    that op so the calls the switches name run on the GLM kernels."""
    found = kernels()
    if isinstance(found, str):  # check_launch refused this before the model was built
        raise SwitchError(f"GLM_MXK / GLM_MXK_PREFILL: {found}")
    set_up = method.process_weights_after_loading

    def process_weights_after_loading(layer) -> None:
        set_up(layer)
        experts = (layer.w13_weight.data, layer.w13_weight_scale.data, layer.w2_weight.data, layer.w2_weight_scale.data)
        layer.moe_op = GlmMxkMoEOp(layer.moe_op, found, experts, decode=decode, prefill=prefill)

    method.process_weights_after_loading = process_weights_after_loading
    logger.info(
        "glm5_hpu: MXFP4 MoE with the GLM kernels (%s): decode %s, prefill unpack %s", found.where, decode, prefill
    )


# ------------------------------------------------------------------ GLM_MOE_PLACEMENT
def _layer_id(prefix: str) -> int | None:
    """``model.layers.{L}.mlp.experts`` (the MTP layer's ``model.layers.{L}.mtp_block...``) -> L."""
    parts = prefix.split(".")
    for a, b in zip(parts, parts[1:], strict=False):
        if a == "layers" and b.isdigit():
            return int(b)
    return None


def _place(method, slot_of: list[int]) -> None:
    """Checkpoint expert e loaded into stored slot slot_of[e]; after vllm-gaudi's set-up (and the
    kernels' wrapper, if any) the layer's op gets the router's ids mapped to those slots."""
    create = method.create_weights
    set_up = method.process_weights_after_loading

    def create_weights(layer, *args, **kwargs):
        kwargs["weight_loader"] = placed_loader(kwargs["weight_loader"], slot_of)
        return create(layer, *args, **kwargs)

    def process_weights_after_loading(layer) -> None:
        set_up(layer)
        layer.moe_op = PlacedMoEOp(layer.moe_op, slot_of, layer.w13_weight.device)

    method.create_weights = create_weights
    method.process_weights_after_loading = process_weights_after_loading


def register_quantization() -> None:
    """Make "mxfp4" resolve to Glm5Mxfp4HpuConfig (vllm-gaudi's platform must accept the name: the
    port's patch mxfp4-quant-on-hpu)."""
    register_quantization_config("mxfp4")(Glm5Mxfp4HpuConfig)
