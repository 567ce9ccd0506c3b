"""seeded-sampling: a seeded request's generator drives only its own row of a sampling call,
not the padded decode rows that repeat that request."""

from fixpack.codemod import Rewrite, replace_once

TARGET = "vllm_gaudi/v1/worker/hpu_input_batch.py"


class GeneratorForFirstRowOnly(Rewrite):
    target = TARGET
    nodes = ["InputBatch.make_selective_sampling_metadata"]

    def rewrite(self, qualname, node):
        node = replace_once(
            node,
            """        output_token_ids: list[list[int]] = []

""",
            """        output_token_ids: list[list[int]] = []

        # Padded decode rows repeat the first request; a seeded generator must be drawn from
        # once per step (its own row), or its stream depends on the decode bucket size.
        generators: dict[int, torch.Generator] = {}
        seeded_seen: set[int] = set()
        for row, req_idx in enumerate(req_indices):
            generator = self.generators.get(req_idx)
            if generator is not None and req_idx not in seeded_seen:
                seeded_seen.add(req_idx)
                generators[row] = generator

""", indent=4)
        return replace_once(
            node,
            """            generators={
                i: self.generators[req_idx]
                for i, req_idx in enumerate(req_indices) if self.generators.get(req_idx, None) is not None
            },
""",
            """            generators=generators,
""", indent=4)
