"""GLM-5.3 on vllm-gaudi's platform (registered by glm5_hpu/vllm_plugin.py when the platform is HPU).

vLLM has the model (``GlmMoeDsaForCausalLM``, its MTP draft ``DeepSeekMTP``) and vllm-gaudi
serves it: its MLA backend (DSA layers as dense MLA, the indexer built and never run:
vllm_gaudi/attention/oot_mla.py), and, with the port's patches mxfp4-quant-on-hpu and
mxfp4-moe-non-gpt-oss, the MXFP4 routed experts through vllm-gaudi's own MXFP4 MoE op
(``VllmMixtureOfExpertsOpMXFP4``, fed expert by expert, the expert-parallel shift included).
What the port adds here:

* the router keys vLLM reads and transformers' config lacks (glm5_hpu/router_config.py), filled
  before the model is built, on the target and on the MTP draft;
* the switches, checked at start-up: a switch whose requested path is not built on HPU stops the
  engine with a message naming the switch and what to set, instead of serving another path than
  the launch asked for (glm5_hpu/hpu_launch.py).

What each switch means on this platform: glm5_hpu/hpu_launch.py.
"""

from __future__ import annotations

import logging

from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP
from vllm.model_executor.models.deepseek_v2 import GlmMoeDsaForCausalLM

from .hpu_launch import hpu_not_built
from .router_config import fill_router_defaults
from .switches import SwitchError, Switches, read_switches

logger = logging.getLogger(__name__)


def check_launch(vllm_config) -> Switches:
    """The switches of this launch, or SwitchError listing every one that cannot be served."""
    switches = read_switches()
    problems = hpu_not_built(switches, max_model_len=vllm_config.model_config.max_model_len,
                             speculative=vllm_config.speculative_config is not None)
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


class GlmMoeDsaHpuForCausalLM(GlmMoeDsaForCausalLM):
    """vLLM's GlmMoeDsaForCausalLM with glm_moe_dsa's router keys and the launch's switches checked."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        check_launch(vllm_config)
        _fill(vllm_config.model_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)


class GlmMoeDsaHpuMTP(DeepSeekMTP):
    """vLLM's DeepSeekMTP (vLLM 0.27.0's draft for glm_moe_dsa) with the router keys filled; any other
    DeepSeek-style MTP is built exactly as vLLM builds it."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        spec = vllm_config.speculative_config
        _fill(vllm_config.model_config, spec.draft_model_config if spec is not None else None)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
