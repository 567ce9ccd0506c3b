"""What the port can serve, checked once at construction with a message that says why."""

from typing import Any


class UnsupportedConfigError(ValueError):
    """The configuration asks for something the GLM-5.3-Flash Gaudi port cannot serve."""


#: the port's vLLM patch (ports/glm-5-3-flash/fixes/) that makes vLLM detect the model as MLA
MLA_PATCH = "mla-detect-glm5-next"
#: what applies the port's patches (from a fixpack checkout; the port image has run it at build)
APPLY_PORT = "python3 apply_all.py --profile v0.26.0 --port glm-5-3-flash"


def check_mla(platform: Any, model_config: Any) -> None:
    """Refuse to build the model on a platform that serves its MLA layers as vLLM's latent MLA (every
    platform but vLLM's CPU one, which gets the expanded form) unless vLLM treats the model as MLA.

    vLLM sizes the attention cache and picks the attention backend from ``ModelConfig.use_mla``; with
    it off, vllm-gaudi allocates per-head key and value caches and its non-MLA backend, and the first
    prefill fails deep inside vllm-gaudi instead of at start-up. ``use_mla`` is off
    when vLLM does not know the text config's model_type as MLA (vLLM 0.26.0 without the port's
    patch) or when VLLM_MLA_DISABLE is set."""
    if platform.is_cpu() or model_config.use_mla:
        return
    if model_config.is_deepseek_mla:
        reason = "vLLM detects it as MLA but VLLM_MLA_DISABLE is set, which turns MLA off: unset VLLM_MLA_DISABLE"
    else:
        reason = (
            f"vLLM does not detect it as MLA: the port's vLLM patch {MLA_PATCH} (glm5_next_text in "
            "is_deepseek_mla, vllm/transformers_utils/model_arch_config_convertor.py) is not applied to this "
            f"vLLM. Apply the port's patches before vLLM starts: {APPLY_PORT} (in the port image: python3 "
            '"$COOKBOOK/fixes/apply_all.py" --profile v0.26.0 --port glm-5-3-flash), then start vLLM again'
        )
    device = getattr(platform, "device_type", None)
    raise UnsupportedConfigError(
        f"GLM-5.3-Flash on the {device!r} platform serves its MLA layers as vLLM's latent MLA, which needs "
        f"vLLM's MLA path (ModelConfig.use_mla) and it is off: {reason}"
    )


def _text(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def validate_config(config: Any, tp_size: int = 1, prefix_caching: bool = False, expert_parallel: bool = False) -> None:
    """Raise :class:`UnsupportedConfigError` listing every problem; return None when servable.

    ``config`` is a transformers ``Glm5NextConfig`` or ``Glm5NextTextConfig``.
    """
    t = _text(config)
    problems: list[str] = []
    if prefix_caching:
        problems.append(
            "prefix caching is not supported: the KDA layers keep one recurrent state per sequence, "
            "not per KV block, so a cached prefix has no state to resume from (serve with prefix caching off)"
        )
    if t.qk_rope_head_dim != 0:
        problems.append(f"qk_rope_head_dim must be 0 (NoPE MLA), got {t.qk_rope_head_dim}")
    if t.hc_mult != 4:
        problems.append(f"hc_mult must be 4 (the Sinkhorn kernel is 4 x 4), got {t.hc_mult}")
    if t.linear_lower_bound is None:
        problems.append("linear_lower_bound is None (Kimi softplus gate); the port implements the bounded GLM gate")
    if t.linear_head_dim % 16:
        problems.append(f"linear_head_dim must be a multiple of 16, got {t.linear_head_dim}")
    bad_types = sorted(set(t.layer_types) - {"linear_attention", "indexed_attention"})
    if bad_types:
        problems.append(f"unknown layer_types {bad_types}")
    if any(kind == "shared" for kind in t.indexer_types):
        problems.append(
            "indexer_types 'shared' is not served: every MLA layer follows a KDA layer, which has no top-k to share"
        )
    if tp_size < 1:
        problems.append(f"tp_size must be >= 1, got {tp_size}")
    else:
        for name, value in (
            ("num_attention_heads", t.num_attention_heads),
            ("linear_num_heads", t.linear_num_heads),
            ("intermediate_size", t.intermediate_size),
            ("moe_intermediate_size", t.moe_intermediate_size),
            ("index_n_heads", t.index_n_heads),
            ("vocab_size", t.vocab_size),
        ):
            if value % tp_size:
                problems.append(f"{name} ({value}) is not divisible by the tensor-parallel size {tp_size}")
        # Expert parallelism places whole routed experts on each of the TP ranks.
        if expert_parallel and t.n_routed_experts % tp_size:
            problems.append(
                f"n_routed_experts ({t.n_routed_experts}) is not divisible by the expert-parallel size {tp_size}"
            )
    if problems:
        raise UnsupportedConfigError(
            "GLM-5.3-Flash port cannot serve this configuration:\n  - " + "\n  - ".join(problems)
        )
