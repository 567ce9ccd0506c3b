"""async-inputs: under async scheduling, take a decode's input id from the device only when
the previous step sampled it there, and bring the previous step's tokens into the output
history that penalties and bad words read."""

from fixpack.codemod import Rewrite, replace_once

TARGET = "vllm_gaudi/v1/worker/hpu_model_runner.py"


class ReportTokensTakenFromDevice(Rewrite):
    """_prepare_input_ids(return_index=True) returns the flattened input positions it wrote
    (a list, empty when it wrote nothing), in every branch."""

    target = TARGET
    nodes = ["HPUModelRunner._prepare_input_ids"]

    def rewrite(self, qualname, node):
        node = replace_once(
            node,
            """        if self.input_batch.prev_sampled_token_ids is None:
            return None
""",
            """        if self.input_batch.prev_sampled_token_ids is None:
            return [] if return_index else None
""", indent=4)
        node = replace_once(
            node,
            """            # So input_ids_cpu will have all the input ids.
            return None
""",
            """            # So input_ids_cpu will have all the input ids.
            return [] if return_index else None
""", indent=4)
        node = replace_once(
            node,
            """            self.input_ids_hpu[:len(flattened_indices)].copy_(prev_sampled_token_ids[:len(flattened_indices)])
            return None
""",
            """            self.input_ids_hpu[:len(flattened_indices)].copy_(prev_sampled_token_ids[:len(flattened_indices)])
            return flattened_indices if return_index else None
""", indent=4)
        return replace_once(
            node,
            """        if return_index:
            return input_ids_index_tensor
""",
            """        if return_index:
            # The positions written here; every other position of input_ids_hpu is stale.
            return flattened_indices
""", indent=4)


class OverwriteOnlyDeviceSampledDecodes(Rewrite):
    target = TARGET
    nodes = ["HPUModelRunner._create_decode_input_data"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            """            self._prepare_input_ids(scheduler_output)
            if num_tokens == 1:
                token_ids_device[:num_decodes] = self.input_ids_hpu[:num_decodes].view(-1, 1)
""",
            """            on_device = self._prepare_input_ids(scheduler_output, return_index=True)
            if num_tokens == 1:
                # Only decodes whose last token was sampled on the device in the previous step
                # take it from input_ids_hpu; the rest of that buffer is stale. The others
                # (re-added after an unscheduled step, resumed) keep their ids from the CPU batch.
                rows = [i for i in on_device if i < num_decodes]
                if rows == list(range(num_decodes)):
                    token_ids_device[:num_decodes] = self.input_ids_hpu[:num_decodes].view(-1, 1)
                elif rows:
                    rows_device = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
                    token_ids_device.index_copy_(0, rows_device,
                                                 self.input_ids_hpu.index_select(0, rows_device).view(-1, 1))
""", indent=4)


class AdvanceAsyncOutputHistory(Rewrite):
    target = TARGET
    nodes = ["HPUModelRunner._prepare_sampling"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            """        # Create the sampling metadata.
        req_id_output_token_ids_lst = \\
""",
            """        # Async scheduling: the previous step's tokens exist only on the device, so nothing
        # appended them to the output history that penalties and bad words read. Append them
        # once per step (a host sync, only when such a request is in the batch), as vLLM's GPU
        # runner does in update_async_output_token_ids. Requests without penalties, bad words or
        # min_tokens never read their history; a re-added request gets its history from the scheduler.
        prev_tokens = self.input_batch.prev_sampled_token_ids
        if (self.use_async_scheduling and prev_tokens is not None
                and prev_tokens is not getattr(self, "_async_history_from", None)):
            self._async_history_from = prev_tokens
            # min_tokens (fed by the logitsprocs-rows fix) counts the history too: without it the
            # stop tokens of such a request would stay masked until max_tokens.
            if (not self.input_batch.no_penalties or self.input_batch.bad_words_token_ids
                    or any(r.sampling_params is not None and r.sampling_params.min_tokens
                           for r in self.requests.values())):
                prev_tokens = prev_tokens.cpu().tolist()
                for req_id, row in (self.input_batch.prev_req_id_to_index or {}).items():
                    req_state = self.requests.get(req_id)
                    if req_state is not None and row < len(prev_tokens):
                        req_state.output_token_ids.append(prev_tokens[row])
        # Create the sampling metadata.
        req_id_output_token_ids_lst = \\
""", indent=4)


class ResetHistoryOnReAdd(Rewrite):
    """With the history now advanced by the worker, a re-added request must take the
    scheduler's view of its outputs even when that view is empty (tokens discarded)."""

    target = TARGET
    nodes = ["HPUModelRunner._update_states"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            """                if self.use_async_scheduling and num_output_tokens > 0:
                    # We must recover the output token ids for resumed requests in the
                    # async scheduling case, so that correct input_ids are obtained.
                    resumed_token_ids = req_data.all_token_ids[req_id]
                    req_state.output_token_ids = resumed_token_ids[-num_output_tokens:]
""",
            """                if self.use_async_scheduling and num_output_tokens > 0:
                    # We must recover the output token ids for resumed requests in the
                    # async scheduling case, so that correct input_ids are obtained.
                    resumed_token_ids = req_data.all_token_ids[req_id]
                    req_state.output_token_ids = resumed_token_ids[-num_output_tokens:]
                elif self.use_async_scheduling:
                    # The scheduler kept no outputs (e.g. it discarded an in-flight token).
                    req_state.output_token_ids = []
""", indent=4)
