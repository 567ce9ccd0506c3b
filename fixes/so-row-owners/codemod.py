"""so-row-owners: place each structured-output request's grammar bitmask at the logits row
that request owns in this step, not at its persistent-batch index."""

from fixpack.codemod import Rewrite, replace_once

TARGET = "vllm_gaudi/v1/worker/hpu_model_runner.py"


class MasksByRowOwner(Rewrite):
    """apply_grammar_bitmask(..., row_req_ids): row i of `logits` belongs to row_req_ids[i];
    each mask goes to its owner's first row, and a request without a row gets no mask."""

    target = TARGET
    nodes = ["HPUModelRunner.apply_grammar_bitmask"]

    def rewrite(self, qualname, node):
        node = replace_once(
            node,
            """        logits: torch.Tensor,
    ):
""",
            """        logits: torch.Tensor,
        row_req_ids: Optional[list[str]] = None,
    ):
""", indent=4)
        node = replace_once(
            node,
            """        struct_out_req_batch_indices: dict[str, int] = {}
        cumulative_offset = 0
        seq = sorted(self.input_batch.req_id_to_index.items(), key=lambda x: x[1])
        for req_id, batch_index in seq:
""",
            """        struct_out_req_batch_indices: dict[str, int] = {}
        cumulative_offset = 0
        seq = sorted(self.input_batch.req_id_to_index.items(), key=lambda x: x[1])
        if row_req_ids is not None:
            # HPU logits are the decodes' rows, then the rows each prefill batch produced:
            # a prefill chunk can have no row (or a resumed prefill several), so the batch
            # index is not the row. A request's rows are consecutive; take its first.
            seq = []
            for row, req_id in enumerate(row_req_ids):
                if req_id in grammar_output.structured_output_request_ids:
                    struct_out_req_batch_indices.setdefault(req_id, row)
        for req_id, batch_index in seq:
""", indent=4)
        return replace_once(
            node,
            """        for req_id in grammar_output.structured_output_request_ids:
            logit_index = struct_out_req_batch_indices[req_id]
            num_spec_tokens = len(scheduler_output.scheduled_spec_decode_tokens.get(req_id, []))
""",
            """        for req_id in grammar_output.structured_output_request_ids:
            logit_index = struct_out_req_batch_indices.get(req_id)
            num_spec_tokens = len(scheduler_output.scheduled_spec_decode_tokens.get(req_id, []))
            if logit_index is None:
                # No logits row for this request in this step: nothing to mask.
                cumulative_index += 1 + num_spec_tokens
                continue
""", indent=4)


class PassRowOwners(Rewrite):
    """sample_tokens passes the owners of the combined logits rows (decodes, then prefills)."""

    target = TARGET
    nodes = ["HPUModelRunner.sample_tokens"]

    def rewrite(self, qualname, node):
        return replace_once(
            node,
            """                self.apply_grammar_bitmask(scheduler_output, grammar_output, logits)
""",
            """                self.apply_grammar_bitmask(scheduler_output, grammar_output, logits,
                                           decode_sampled_requests + prefill_sampled_requests)
""", indent=4)
