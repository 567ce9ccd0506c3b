"""Never merge two prefills into one batch for mamba-like (hybrid) models."""

from fixpack.codemod import Rewrite, replace_once

ANCHOR = "    # --- Logic to handle chunked prefill/prefix caching for HPU ---\n"

GUARD = (
    "    # fixpack hybrid-no-prefill-merge: the mamba/GDN/linear-attention prefill\n"
    "    # path of _form_prefill_batch handles one sequence per prefill batch\n"
    "    # (it asserts len(req_ids) == 1 with prefix caching). Keep every\n"
    "    # request of a hybrid model in its own prefill batch.\n"
    "    if self.num_mamba_like_layers > 0:\n"
    "        return False\n"
)


class NoPrefillMergeForHybrid(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    nodes = ["HPUModelRunner._can_merge_prefill_contents"]

    def rewrite(self, qualname, node):
        new = replace_once(node, ANCHOR, GUARD + ANCHOR)
        # Re-parsing loses the blank line's indentation style; keep the original one.
        return new
