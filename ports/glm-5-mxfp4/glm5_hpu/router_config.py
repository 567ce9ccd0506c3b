"""glm_moe_dsa's router keys as vLLM's DeepSeek code reads them, filled where a config lacks them.

vLLM's ``DeepseekV2MoE`` (0.27.0 and 0.30.0) reads DeepSeek-V3's ``scoring_func`` (default
softmax) and ``topk_method`` (``noaux_tc`` creates ``e_score_correction_bias``); transformers
5.23.0's ``GlmMoeDsaConfig`` has neither, and its router is sigmoid scores with the correction
bias. A config.json written by transformers therefore loads with the wrong routing, or fails on
the bias ("KeyError: layers.1.mlp.gate.e_score_correction_bias"). Whether the release's own
config.json carries the keys is not verified (the Hub is not reachable here).
"""

from __future__ import annotations

#: the router transformers runs for glm_moe_dsa, in vLLM's DeepSeek-V3 keys
ROUTER_DEFAULTS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


def is_glm_moe_dsa(config) -> bool:
    """True for a glm_moe_dsa config, also after vLLM has renamed an MTP draft's ``model_type`` to
    ``deepseek_mtp`` (SpeculativeConfig.hf_config_override sets the instance attribute; the
    config class keeps its own)."""
    return "glm_moe_dsa" in (getattr(config, "model_type", None), getattr(type(config), "model_type", None))


def fill_router_defaults(config) -> list[str]:
    """Set each ROUTER_DEFAULTS key that ``config`` (a glm_moe_dsa config) lacks or holds as None;
    returns the keys set. Any other model's config is left as it is."""
    if not is_glm_moe_dsa(config):
        return []
    filled = []
    for name, value in ROUTER_DEFAULTS.items():
        if getattr(config, name, None) is None:
            setattr(config, name, value)
            filled.append(name)
    return filled
