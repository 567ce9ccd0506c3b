"""A decoder layer may say, per forward, whether the step mark after it is wanted: the hook
that modify_model_layers registers marks only when the layer's `hpu_mark_step` (attribute or
property; absent means yes) is true. Line count kept."""

from fixpack.codemod import Rewrite, replace_once


class LayerDecidesItsMarkStep(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    nodes = ["modify_model_layers"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            "        htorch.core.mark_step()\n",
            "        if getattr(module, 'hpu_mark_step', True): htorch.core.mark_step()  # fixpack decode-layer-group: the layer may group layers into one graph\n")
