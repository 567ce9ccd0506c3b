"""Never merge two prefills into one batch for mamba-like (hybrid) models."""

import libcst as cst
import libcst.matchers as m

from fixpack.kinds.codemod import Codemod, statements

GUARD = statements(
    "# fixpack hybrid-no-prefill-merge: the mamba/GDN/linear-attention prefill\n"
    "# path of _form_prefill_batch handles one sequence per prefill batch\n"
    "# (it asserts len(req_ids) == 1 with prefix caching). Keep every\n"
    "# request of a hybrid model in its own prefill batch.\n"
    "if self.num_mamba_like_layers > 0:\n"
    "    return False\n"
)[0]
IS_GUARD = m.If(
    test=m.Comparison(left=m.Attribute(value=m.Name("self"), attr=m.Name("num_mamba_like_layers"))),
    body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Return(value=m.Name("False"))])]),
)
DOCSTRING = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
PLACE = "guard at the top of _can_merge_prefill_contents"


class NoPrefillMergeForHybrid(Codemod):
    DESCRIPTION = "A hybrid (mamba-like) model never merges a prefill into another prefill's batch."
    TARGET = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    PLACES = (PLACE,)
    SCOPE = ("HPUModelRunner._can_merge_prefill_contents",)

    @m.leave(m.FunctionDef(name=m.Name("_can_merge_prefill_contents")))
    def guard_first(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        body = list(updated.body.body)
        top = 1 if body and m.matches(body[0], DOCSTRING) else 0
        if top < len(body) and m.matches(body[top], IS_GUARD):
            return self.at(PLACE, updated, updated)
        body.insert(top, GUARD)
        return self.at(PLACE, updated, updated.with_changes(body=updated.body.with_changes(body=body)))
