"""Each real codemod of the pack on a small before text: the after text, and the after text is
a fixed point (LibCST's CodemodTest style). Their behaviour on the real release is proven by
each fix's own red/green tests (`fixpack check`); tests/release/test_codemod_reformat.py runs them on
the reformatted release."""

from __future__ import annotations

from packtests.codemods import assert_codemod


def test_hybrid_no_prefill_merge_guards_the_top_of_the_function():
    assert_codemod(
        "fixes/hybrid-no-prefill-merge",
        """\
        class HPUModelRunner:
            def _can_merge_prefill_contents(self, lhs, rhs):
                \"\"\"Whether rhs may join lhs.\"\"\"
                # an existing comment
                return lhs.size + rhs.size < 8
        """,
        """\
        class HPUModelRunner:
            def _can_merge_prefill_contents(self, lhs, rhs):
                \"\"\"Whether rhs may join lhs.\"\"\"
                # fixpack hybrid-no-prefill-merge: the mamba/GDN/linear-attention prefill
                # path of _form_prefill_batch handles one sequence per prefill batch
                # (it asserts len(req_ids) == 1 with prefix caching). Keep every
                # request of a hybrid model in its own prefill batch.
                if self.num_mamba_like_layers > 0:
                    return False
                # an existing comment
                return lhs.size + rhs.size < 8
        """,
    )


def test_seeded_sampling_maps_each_generator_to_its_first_row():
    assert_codemod(
        "fixes/seeded-sampling",
        """\
        class InputBatch:
            def make_selective_sampling_metadata(self, req_indices):
                output_token_ids: list[list[int]] = []

                return SamplingMetadata(
                    temperature=None,
                    generators={i: self.generators[r] for i, r in enumerate(req_indices) if r in self.generators},
                )
        """,
        """\
        class InputBatch:
            def make_selective_sampling_metadata(self, req_indices):
                output_token_ids: list[list[int]] = []

                # Padded decode rows repeat the first request; a seeded generator must be drawn from
                # once per step (its own row), or its stream depends on the decode bucket size.
                generators: dict[int, torch.Generator] = {}
                seeded_seen: set[int] = set()
                for row, req_idx in enumerate(req_indices):
                    generator = self.generators.get(req_idx)
                    if generator is not None and req_idx not in seeded_seen:
                        seeded_seen.add(req_idx)
                        generators[row] = generator

                return SamplingMetadata(
                    temperature=None,
                    generators=generators,
                )
        """,
    )


def test_structured_output_rows_samples_by_row_owner_and_gives_unfinished_chunks_no_row():
    assert_codemod(
        "fixes/structured-output-rows",
        """\
        class HPUModelRunner:
            def _extract_prefill_batch_contents(self):
                if self.use_async_scheduling or self.use_structured_output:
                    logits_positions.append(last)

            def sample_tokens(self, pd_info):
                sampler_output, _m = self._run_sampling(batch_changed, logits,
                                                        pd_info.prompt_req_ids + pd_info.decode_req_ids,
                                                        logits.shape[0])
                struct_logprobs_req_ids = (list(pd_info.decode_req_ids) + list(pd_info.prompt_req_ids))
        """,
        """\
        class HPUModelRunner:
            def _extract_prefill_batch_contents(self):
                # Not for structured output: under sync scheduling the chunk's sampled token
                # would be returned as generated, and use_structured_output is still the
                # previous step's here. Grammar masks are placed by logits-row owner.
                if self.use_async_scheduling:
                    logits_positions.append(last)

            def sample_tokens(self, pd_info):
                # Row owners in logits order; a prefill chunk may own no row.
                sampler_output, _m = self._run_sampling(batch_changed, logits,
                                                        decode_sampled_requests + prefill_sampled_requests,
                                                        logits.shape[0])
                struct_logprobs_req_ids = decode_sampled_requests + prefill_sampled_requests
        """,
    )


def test_decode_layer_group_lets_the_layer_decide_its_mark_step():
    assert_codemod(
        "ports/glm-5-3-flash/fixes/decode-layer-group",
        """\
        def modify_model_layers(module, suffix_list, n=1, counter=None):

            def forward_hook(module, args, output):
                htorch.core.mark_step()
                return output
        """,
        """\
        def modify_model_layers(module, suffix_list, n=1, counter=None):

            def forward_hook(module, args, output):
                if getattr(module, 'hpu_mark_step', True): htorch.core.mark_step()  # fixpack decode-layer-group: the layer may group layers into one graph
                return output
        """,
    )
