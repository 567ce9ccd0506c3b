"""What vLLM 0.30.0's CPU platform lacks to serve a glm5_mxfp4 checkpoint (registered by
glm5_hpu/vllm_plugin.py on CPU only). vLLM's own model classes do the rest.

* ``GlmMoeDsaCpuForCausalLM`` / ``GlmMoeDsaCpuMTP``: vLLM's ``GlmMoeDsaForCausalLM`` and
  ``DeepSeekMTP``, built with dense attention. vLLM builds the DSA indexer and a sparse MLA
  layer whenever the config has ``index_topk``, and its CPU platform refuses sparse attention
  ("Sparse Attention is not supported on CPU"). Built from a view of the config without
  ``index_topk`` they get vLLM's dense MLA (the CPU_MLA backend) and no indexer; vLLM's loader
  then drops the indexer's checkpoint weights (the MTP's is given them filtered). The view also
  fills the router keys vLLM reads and transformers' config lacks (ROUTER_DEFAULTS).
  Dense attention is the model's own attention while a query sees at most 32,768 keys (the
  recipe's DSA threshold, glm5_hpu/dsa.py); above that the top-k is not built for this path, so
  with GLM_DSA_SPARSE=1 a --max-model-len above the threshold is refused rather than served
  with other attention than the model's.
* ``Glm5Mxfp4CpuConfig`` (quantization "mxfp4", for a checkpoint whose quantization_config
  the glm5_mxfp4 converter wrote) with ``Mxfp4CpuMoEMethod``: vLLM's ``Mxfp4MoEMethod``
  parameters (its own ``create_weights`` and weight loaders), and the forward of
  glm5_hpu/moe_mxfp4.py: each chosen expert's blocks dequantized on the fly, bit for bit as the
  converter decodes them, in the activation dtype. Any other mxfp4 checkpoint gets vLLM's
  stock method. float32 activations are accepted too (the CPU reference runs in float32).
* ``rejection_greedy_sample``: speculative decoding's greedy rejection in torch (vLLM's is a
  Triton kernel, which its CPU build cannot run); sampled requests under speculation are refused.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import cast

import torch
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4Config, Mxfp4MoEMethod
from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP
from vllm.model_executor.models.deepseek_v2 import GlmMoeDsaForCausalLM

from . import placement as port_placement
from .dsa import DENSE_UNTIL_KEYS
from .moe_mxfp4 import MxfpExperts
from .router_config import ROUTER_DEFAULTS
from .switches import SwitchError, read_switches

# a child of vLLM's "vllm" logger, whose handler vLLM configures: under our own name the lines
# never reached a server's log
logger = logging.getLogger(f"vllm.{__name__}")

#: quantization_config["converter"] starts with this for the port's checkpoints
CONVERTER = "glm5_mxfp4"
#: config attributes whose presence makes vLLM build the DSA indexer and sparse MLA
SPARSE_ATTRS = ("index_topk",)


# ------------------------------------------------------------------ dense attention (no indexer)
def dense_view(config):
    """A copy of ``config`` on which ``hasattr(config, "index_topk")`` is False (vLLM's test for
    DSA); every other attribute is the original's. The class is a subclass of the original's."""
    cls = type(config)

    def _hidden(self):
        raise AttributeError("index_topk: hidden by glm5_hpu (dense attention on CPU)")

    dense_cls = type(cls.__name__, (cls,), {name: property(_hidden) for name in SPARSE_ATTRS})
    view = copy.copy(config)
    for name in SPARSE_ATTRS:
        view.__dict__.pop(name, None)
    view.__class__ = dense_cls
    if getattr(config, "model_type", None) == "glm_moe_dsa" or hasattr(config, "index_topk"):
        for name, value in ROUTER_DEFAULTS.items():
            if getattr(config, name, None) is None:
                setattr(view, name, value)
    return view


@contextlib.contextmanager
def _dense_configs(*model_configs):
    """Each ModelConfig's hf_config (and hf_text_config, where it is the same object) replaced by
    its dense view while vLLM builds the model; restored afterwards for the rest of the engine."""
    saved = []
    try:
        for mc in model_configs:
            if mc is None:
                continue
            hf, text = mc.hf_config, mc.hf_text_config
            view = dense_view(hf)
            saved.append((mc, hf, text))
            mc.hf_config = view
            if text is hf:
                mc.hf_text_config = view
        yield
    finally:
        for mc, hf, text in saved:
            mc.hf_config, mc.hf_text_config = hf, text


def _check_dsa_threshold(vllm_config) -> None:
    switches = read_switches()
    max_len = vllm_config.model_config.max_model_len
    if switches.dsa_sparse and max_len > DENSE_UNTIL_KEYS:
        raise ValueError(
            f"GLM_DSA_SPARSE=1 with --max-model-len {max_len}: on CPU the port runs dense attention, "
            f"which is the model's DSA only up to {DENSE_UNTIL_KEYS} keys; the top-k above that is not "
            f"built for vLLM's CPU path. Use --max-model-len <= {DENSE_UNTIL_KEYS} or GLM_DSA_SPARSE=0."
        )


class GlmMoeDsaCpuForCausalLM(GlmMoeDsaForCausalLM):
    """vLLM's GlmMoeDsaForCausalLM with dense attention and no DSA indexer (CPU)."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        _check_dsa_threshold(vllm_config)
        with _dense_configs(vllm_config.model_config):
            super().__init__(vllm_config=vllm_config, prefix=prefix)


class GlmMoeDsaCpuMTP(DeepSeekMTP):
    """vLLM's DeepSeekMTP (the glm_moe_dsa draft, "DeepseekV32MTPModel") with dense attention."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        spec = vllm_config.speculative_config
        draft = spec.draft_model_config if spec is not None else None
        configs = [vllm_config.model_config] + (
            [draft] if draft is not None and draft is not vllm_config.model_config else []
        )
        with _dense_configs(*configs):
            super().__init__(vllm_config=vllm_config, prefix=prefix)

    def load_weights(self, weights):
        # No indexer was built; unlike the main model's loader, DeepSeekMTP's does not drop the
        # indexer's checkpoint weights of a layer without one.
        return super().load_weights((name, w) for name, w in weights if ".indexer." not in name)


# ------------------------------------------------------------------ MXFP4 MoE on CPU
class Mxfp4CpuMoEMethod(FusedMoEMethodBase):
    """Routed experts held packed (vLLM's Mxfp4MoEMethod parameters: w13_weight U8 [E, 2I, H/2],
    w13_weight_scale U8 [E, 2I, H/32], w2_weight U8 [E, H, I/2], w2_weight_scale U8 [E, H, I/32]);
    the forward is glm5_hpu/moe_mxfp4.py's (GLM_MXK=0, the reference path). Routing and the
    shared expert stay vLLM's."""

    def __init__(self, moe, layer_id: int | None):
        super().__init__(moe)
        switches = read_switches()
        if switches.mxk or switches.mxk_prefill:
            raise SwitchError(
                "GLM_MXK / GLM_MXK_PREFILL = 1 on CPU: the MXFP4 MoE kernels run on HPU only; "
                "unset them (auto) or set 0 for the reference path"
            )
        self.layer_id = layer_id
        self.placement_file = switches.moe_placement
        self.experts: MxfpExperts | None = None

    # vLLM's own parameter layout and loaders (Mxfp4MoEMethod.create_weights reads only self.moe)
    create_weights = Mxfp4MoEMethod.create_weights

    def get_fused_moe_quant_config(self, layer):
        return None

    def process_weights_after_loading(self, layer) -> None:
        if layer.activation.name.lower() != "silu":
            raise ValueError(f"{type(self).__name__}: activation {layer.activation}, glm_moe_dsa uses silu")
        if getattr(layer, "w13_bias", None) is not None:
            raise ValueError(f"{type(self).__name__}: expert biases are not part of glm_moe_dsa")
        n_local = layer.w13_weight.shape[0]
        emap = layer.expert_map
        if emap is None:
            ids = list(range(n_local))  # storage slot s holds logical expert s
        else:  # expert parallel: slot s holds the global expert the map sends to s
            ids = [0] * n_local
            for g, s in enumerate(emap.tolist()):
                if s >= 0:
                    ids[s] = g
        w13, s13, w2, s2 = (
            layer.w13_weight.data,
            layer.w13_weight_scale.data,
            layer.w2_weight.data,
            layer.w2_weight_scale.data,
        )
        if self.placement_file is not None and emap is not None:
            raise NotImplementedError("GLM_MOE_PLACEMENT with expert parallelism is not built for the CPU path")
        if self.placement_file is not None:
            # GLM_MOE_PLACEMENT: store the experts in the file's order for this layer (storage only)
            # a prefix without layers.N (layer_id None) has no entry in the file: the checkpoint's order
            layer = cast(int, self.layer_id)
            order = port_placement.from_switch(self.placement_file, self._hf_config).order(layer)
            perm = torch.tensor(order)
            w13, s13, w2, s2 = (t[perm].contiguous() for t in (w13, s13, w2, s2))
            ids = list(order)
        self.experts = MxfpExperts(ids, w13, s13, w2, s2)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        assert self.experts is not None, "process_weights_after_loading has not run"
        return self.experts.forward(x, topk_ids.long(), topk_weights.to(torch.float32))


class Glm5Mxfp4CpuConfig(Mxfp4Config):
    """vLLM's Mxfp4Config; for a checkpoint the glm5_mxfp4 converter wrote, routed experts get
    Mxfp4CpuMoEMethod (vLLM's Mxfp4MoEMethod has no CPU backend) and float32 is allowed."""

    def __init__(self, ignored_layers=None, glm5_converter: str | None = None):
        super().__init__(ignored_layers)
        self.glm5_converter = glm5_converter
        self.hf_config = None

    @classmethod
    def from_config(cls, config):
        conv = config.get("converter")
        return cls(glm5_converter=conv if isinstance(conv, str) and conv.startswith(CONVERTER) else None)

    def get_supported_act_dtypes(self):
        if self.glm5_converter:
            return [torch.bfloat16, torch.float32]
        return super().get_supported_act_dtypes()

    def maybe_update_config(self, model_name, hf_config=None, revision=None):
        self.hf_config = hf_config
        return super().maybe_update_config(model_name, hf_config=hf_config, revision=revision)

    def get_quant_method(self, layer, prefix: str):
        from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

        if self.glm5_converter and isinstance(layer, RoutedExperts):
            method = Mxfp4CpuMoEMethod(layer.moe_config, _layer_id(prefix))
            method._hf_config = self.hf_config
            return method
        return super().get_quant_method(layer, prefix)


def _layer_id(prefix: str) -> int | None:
    parts = prefix.split(".")
    for a, b in zip(parts, parts[1:], strict=False):  # neighbours: parts[1:] is one shorter
        if a == "layers" and b.isdigit():
            return int(b)
    return None


def register_quantization() -> None:
    """Make "mxfp4" resolve to Glm5Mxfp4CpuConfig (the decorator above ran on import)."""
    register_quantization_config("mxfp4")(Glm5Mxfp4CpuConfig)


# ------------------------------------------------------------------ speculative decoding on CPU
def rejection_greedy_sample(
    output_token_ids,
    cu_num_draft_tokens,
    draft_token_ids,
    target_argmax,
    bonus_token_ids,
    is_greedy,
    max_spec_len,
    uniform_probs,
    synthetic_conditional_rates,
):
    """vLLM 0.30.0's greedy rejection (``rejection_greedy_sample_kernel``, Triton only) in torch:
    per greedy request, keep the target's argmax at each draft position up to and including the
    first one where the draft differs; if none differs, append the bonus token."""
    if synthetic_conditional_rates is not None:
        raise NotImplementedError("synthetic acceptance rates are not provided by glm5_hpu's CPU rejection sampler")
    ends = cu_num_draft_tokens.tolist()
    greedy = None if is_greedy is None else is_greedy.tolist()
    draft, target = draft_token_ids.tolist(), target_argmax.tolist()
    for req, end in enumerate(ends):
        if greedy is not None and not greedy[req]:
            continue
        start = 0 if req == 0 else ends[req - 1]
        rejected = False
        for pos in range(end - start):
            output_token_ids[req, pos] = target[start + pos]
            if draft[start + pos] != target[start + pos]:
                rejected = True
                break
        if not rejected:
            output_token_ids[req, end - start] = bonus_token_ids[req]


# vLLM registers a Triton warm-up on the function it dispatches through; nothing to warm up here
rejection_greedy_sample.register_warmup = lambda **kwargs: None  # type: ignore[attr-defined]


def _no_random_rejection(*args, **kwargs):
    raise NotImplementedError(
        "speculative decoding of a request with temperature > 0 on CPU: vLLM 0.30.0's rejection sampler "
        "runs Triton kernels, and glm5_hpu provides the greedy rejection only"
    )


def register_rejection_sampler() -> None:
    """Point vLLM's rejection sampler at the torch greedy rejection (it looks the function up as a
    module global at each call); sampled requests get a clear refusal instead of a Triton error."""
    from vllm.v1.sample import rejection_sampler as rs

    rs._rejection_greedy_sample = rejection_greedy_sample
    rs.sample_recovered_tokens = _no_random_rejection
