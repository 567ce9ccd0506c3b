"""seeded-sampling: a seeded request's generator drives only its own row of a sampling call,
not the padded decode rows that repeat that request."""

import libcst as cst
import libcst.matchers as m

from fixpack.kinds.codemod import Codemod, statements

IN_FN = m.FunctionDef(name=m.Name("make_selective_sampling_metadata"))
FIRST_ROW_GENERATORS = statements(
    "# Padded decode rows repeat the first request; a seeded generator must be drawn from\n"
    "# once per step (its own row), or its stream depends on the decode bucket size.\n"
    "generators: dict[int, torch.Generator] = {}\n"
    "seeded_seen: set[int] = set()\n"
    "for row, req_idx in enumerate(req_indices):\n"
    "    generator = self.generators.get(req_idx)\n"
    "    if generator is not None and req_idx not in seeded_seen:\n"
    "        seeded_seen.add(req_idx)\n"
    "        generators[row] = generator\n"
)
# the map is built once the output token ids are declared, before the metadata is returned
AFTER = m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name("output_token_ids"))])
BUILT = m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name("generators"))])
MAP, ARG = "first-row generator map", "generators argument"


class GeneratorForFirstRowOnly(Codemod):
    DESCRIPTION = "A seeded request's generator drives only its own row, not the padded rows repeating it."
    TARGET = "vllm_gaudi/v1/worker/hpu_input_batch.py"
    PLACES = (MAP, ARG)
    SCOPE = ("InputBatch.make_selective_sampling_metadata",)

    @m.call_if_inside(IN_FN)
    @m.leave(m.Arg(keyword=m.Name("generators"), value=m.DictComp()))
    def use_first_row_map(self, original: cst.Arg, updated: cst.Arg):
        return self.at(ARG, updated, updated.with_changes(value=cst.Name("generators")))

    @m.call_if_inside(IN_FN)
    @m.leave(m.Arg(keyword=m.Name("generators"), value=m.Name("generators")))
    def already_uses_map(self, original: cst.Arg, updated: cst.Arg):
        return self.at(ARG, updated, updated)

    @m.leave(IN_FN)
    def build_map_once(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        body = list(updated.body.body)
        if any(m.matches(s, BUILT) for s in body):
            return self.at(MAP, updated, updated)
        at = [i for i, s in enumerate(body) if m.matches(s, AFTER)]
        if len(at) != 1:
            return updated  # the place is not there: reported as found 0 times
        first, *rest = FIRST_ROW_GENERATORS
        first = first.with_changes(leading_lines=[cst.EmptyLine(indent=False), *first.leading_lines])
        body[at[0] + 1 : at[0] + 1] = [first, *rest]
        return self.at(MAP, updated, updated.with_changes(body=updated.body.with_changes(body=body)))
