"""structured-output-rows: in a step with structured output, sample each logits row with its
owner's parameters, report logprobs for the same rows, and give an unfinished prefill chunk
no logits row under sync scheduling."""

from fixpack.codemod import Rewrite, replace_once

TARGET = "vllm_gaudi/v1/worker/hpu_model_runner.py"


class SampleRowsByOwner(Rewrite):
    """The combined logits are [decode rows, then each prefill batch's rows]; their owners
    are decode_sampled_requests + prefill_sampled_requests (not prompt ids + decode ids)."""

    target = TARGET
    nodes = ["HPUModelRunner.sample_tokens"]

    def rewrite(self, qualname, node):
        node = replace_once(
            node,
            """            sampler_output, _sampling_metadata = self._run_sampling(batch_changed, logits,
                                                                    pd_info.prompt_req_ids + pd_info.decode_req_ids,
                                                                    logits.shape[0])
""",
            """            # Row owners in logits order; a prefill chunk may own no row.
            sampler_output, _sampling_metadata = self._run_sampling(batch_changed, logits,
                                                                    decode_sampled_requests + prefill_sampled_requests,
                                                                    logits.shape[0])
""", indent=4)
        return replace_once(
            node,
            """            struct_logprobs_req_ids = (list(pd_info.decode_req_ids) + list(pd_info.prompt_req_ids))
""",
            """            struct_logprobs_req_ids = decode_sampled_requests + prefill_sampled_requests
""", indent=4)


class NoRowForUnfinishedChunk(Rewrite):
    """Only async scheduling needs a (discarded) row for an unfinished prefill chunk. With
    sync scheduling that row's token is returned to the scheduler as generated; and the
    structured-output flag read here was still the previous step's (sample_tokens sets it
    after _prepare_inputs). Grammar masks are placed by row owner (so-row-owners)."""

    target = TARGET
    nodes = ["HPUModelRunner._extract_prefill_batch_contents"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            """            if self.use_async_scheduling or self.use_structured_output:
""",
            """            # Not for structured output: under sync scheduling the chunk's sampled token
            # would be returned as generated, and use_structured_output is still the
            # previous step's here. Grammar masks are placed by logits-row owner.
            if self.use_async_scheduling:
""", indent=4)
