"""Hybrid models outside vllm-gaudi's architecture list get their mamba-like layers' KV cache
group too: any MambaBase layer that declares an unset `cache_group_idx` (None) is given its
group, found by the layer name the KV cache config already holds. Line count kept, so the
profile's diffs of hpu_model_runner.py still apply on top of the port."""

from fixpack.codemod import Rewrite, replace_once

OLD = (
    "    mamba_like_arch = [\n"
    '        "GraniteMoeHybridForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",\n'
    '        "Qwen3NextForCausalLM"\n'
    "    ]\n"
    "    if not any(arch in getattr(model.config, 'architectures', []) for arch in mamba_like_arch):\n"
    "        return\n"
)

NEW = (
    '    mamba_like_arch = ["GraniteMoeHybridForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3NextForCausalLM"]\n'
    "    if not any(arch in getattr(model.config, 'architectures', []) for arch in mamba_like_arch):  # fixpack kda-cache-group: other hybrids (GLM-5.3-Flash KDA): a MambaBase layer with cache_group_idx None gets its group by name\n"
    "        modules = dict(model.named_modules())\n"
    "        for group_idx, layer in ((g, modules.get(n)) for g, group in enumerate(kv_cache_config.kv_cache_groups) for n in group.layer_names):\n"
    "            if isinstance(layer, MambaBase) and getattr(layer, 'cache_group_idx', 0) is None: layer.cache_group_idx = torch.tensor(group_idx, dtype=torch.long, device=next(layer.parameters()).device)\n"
    "        return\n"
)


class CacheGroupForOtherHybrids(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    nodes = ["maybe_set_mamba_kv_cache_groups_ids"]

    def rewrite(self, qualname, node):
        return replace_once(node, OLD, NEW)
