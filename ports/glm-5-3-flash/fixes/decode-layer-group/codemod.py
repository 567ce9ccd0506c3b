"""A decoder layer may say, per forward, whether the step mark after it is wanted: the hook
that modify_model_layers registers marks only when the layer's `hpu_mark_step` (attribute or
property; absent means yes) is true. Line count kept."""

import libcst as cst
import libcst.matchers as m

from fixpack.kinds.codemod import Codemod

IN_FN = m.FunctionDef(name=m.Name("modify_model_layers"))
MARK_STEP = m.Expr(
    value=m.Call(
        func=m.Attribute(value=m.Attribute(value=m.Name("htorch"), attr=m.Name("core")), attr=m.Name("mark_step")),
        args=[],
    )
)
WANTED = cst.parse_expression("getattr(module, 'hpu_mark_step', True)")
IS_WANTED = m.Call(
    func=m.Name("getattr"), args=[m.Arg(m.Name("module")), m.Arg(m.SimpleString()), m.Arg(m.Name("True"))]
)
COMMENT = "# fixpack decode-layer-group: the layer may group layers into one graph"
PLACE = "mark_step of the layer hook"


class LayerDecidesItsMarkStep(Codemod):
    DESCRIPTION = "The forward hook marks a step only when the layer's hpu_mark_step (default True) says so."
    TARGET = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    PLACES = (PLACE,)
    SCOPE = ("modify_model_layers",)

    @m.call_if_inside(IN_FN)
    @m.leave(m.SimpleStatementLine(body=[MARK_STEP]))
    def guard_mark_step(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        # one line (`if wanted: mark_step()  # why`): the profile's diffs below keep their offsets
        suite = cst.SimpleStatementSuite(
            body=updated.body,
            trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(COMMENT)
            ),
        )
        return self.at(PLACE, updated, cst.If(test=WANTED, body=suite, leading_lines=updated.leading_lines))

    @m.call_if_inside(IN_FN)
    @m.leave(m.If(test=IS_WANTED, body=m.SimpleStatementSuite(body=[MARK_STEP])))
    def already_guarded(self, original: cst.If, updated: cst.If):
        return self.at(PLACE, updated, updated)
