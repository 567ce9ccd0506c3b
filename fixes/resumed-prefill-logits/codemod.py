"""resumed-prefill-logits: a request resumed with prefix-cache hits counts its earlier outputs as
prompt, so its re-prefill produces one logit (at the last position), not one per output."""

from fixpack.codemod import Rewrite, replace_once


class ResumeMeansOutputsToRecompute(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_input_batch.py"
    nodes = ["InputBatch.add_request"]

    def rewrite(self, qualname, node):
        new_node = replace_once(
            node,
            """        # This also assumes that preemption is complete and reduces num_computed_tokens to 0 and preempted sequences
        # don't retain any originally used cache blocks.
        if request.num_computed_tokens == 0:
""",
            """        # A request resumed after preemption can come back with prefix-cache hits (num_computed_tokens > 0), so
        # test for what a resume means: more than its last sampled token is left to compute. Otherwise only
        # len(prompt) counts as prompt and its re-prefill samples one token per recomputed output position.
        # A request merely unscheduled for a step (num_computed_tokens == num_tokens - 1) stays a decode.
        if request.num_computed_tokens < request.num_tokens - 1:
""", indent=4)
        # Keep the blank lines above the method as they were (re-parsing indents them).
        return new_node
