"""prompt-logprobs: map -1 to the vocabulary size, keep a chunked prefill's prompt logprobs on
the request state across steps where it is not scheduled, and never register them again for a
request that already returned them."""

from fixpack.codemod import Rewrite, replace_once

INPUT_BATCH = "vllm_gaudi/v1/worker/hpu_input_batch.py"
RUNNER = "vllm_gaudi/v1/worker/hpu_model_runner.py"


class KeepPromptLogprobsOnRequest(Rewrite):
    target = INPUT_BATCH
    nodes = ["CachedRequestState"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            """    pooling_states: PoolingStates | None = None

""",
            """    pooling_states: PoolingStates | None = None

    # Prompt logprobs of the chunks prefilled so far. Kept here, not in the InputBatch,
    # because a request not scheduled for a step is removed from the batch and re-added.
    in_progress_prompt_logprobs_cpu: Optional[LogprobsTensors] = None

""")


class RegisterLogprobs(Rewrite):
    target = INPUT_BATCH
    nodes = ["InputBatch.add_request"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            """            if sampling_params.logprobs is not None:
                self.num_logprobs[req_id] = sampling_params.logprobs
            if sampling_params.prompt_logprobs is not None:
                self.num_prompt_logprobs[req_id] = (sampling_params.prompt_logprobs)
""",
            """            # -1 asks for the whole vocabulary (as vLLM's GPU input batch maps it); raw -1
            # reaches torch.topk and the sampler's "unsorted" branch, which HPU cannot handle.
            if sampling_params.logprobs is not None:
                self.num_logprobs[req_id] = (self.vocab_size
                                             if sampling_params.logprobs == -1 else sampling_params.logprobs)
            # A request with outputs has finished its prompt and returned its prompt logprobs;
            # re-adding it (after an unscheduled step or a preemption) must not compute them again.
            if sampling_params.prompt_logprobs is not None and not request.output_token_ids:
                self.num_prompt_logprobs[req_id] = (self.vocab_size if sampling_params.prompt_logprobs == -1 else
                                                    sampling_params.prompt_logprobs)
""", indent=4)


class InProgressOnRequestState(Rewrite):
    target = RUNNER
    nodes = ["HPUModelRunner._get_prompt_logprobs_dict"]

    def rewrite(self, qualname, node):
        node = replace_once(
            node,
            """            logprobs_tensors = in_progress_dict.get(req_id)
            if not logprobs_tensors:
                # Create empty logprobs CPU tensors for the entire prompt.
                # If chunked, we'll copy in slice by slice.
                logprobs_tensors = LogprobsTensors.empty_cpu(num_prompt_tokens - 1, num_prompt_logprobs + 1)
                in_progress_dict[req_id] = logprobs_tensors
""",
            """            # On the request state: it survives steps where the request is not scheduled.
            logprobs_tensors = request.in_progress_prompt_logprobs_cpu
            if logprobs_tensors is None:
                # Create empty logprobs CPU tensors for the entire prompt.
                # If chunked, we'll copy in slice by slice.
                logprobs_tensors = LogprobsTensors.empty_cpu(num_prompt_tokens - 1, num_prompt_logprobs + 1)
                request.in_progress_prompt_logprobs_cpu = logprobs_tensors
""", indent=4)
        return replace_once(
            node,
            """            del num_prompt_logprobs_dict[req_id]
            in_progress_dict.pop(req_id, None)
""",
            """            del num_prompt_logprobs_dict[req_id]
            in_progress_dict.pop(req_id, None)
            self.requests[req_id].in_progress_prompt_logprobs_cpu = None
""", indent=4)
