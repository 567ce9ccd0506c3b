"""structured-output-rows: in a step with structured output, sample each logits row with its
owner's parameters, report logprobs for the same rows, and give an unfinished prefill chunk
no logits row under sync scheduling."""

import libcst as cst
import libcst.matchers as m

from fixpack.kinds.codemod import Codemod, comment_lines

TARGET = "vllm_gaudi/v1/worker/hpu_model_runner.py"


def self_attr(name: str) -> m.Attribute:
    return m.Attribute(value=m.Name("self"), attr=m.Name(name))


def pd_info(name: str) -> m.Attribute:
    return m.Attribute(value=m.Name("pd_info"), attr=m.Name(name))


def listed(name: str) -> m.Call:
    return m.Call(func=m.Name("list"), args=[m.Arg(pd_info(name))])


# The combined logits are [decode rows, then each prefill batch's rows]: these are their owners.
OWNERS = cst.parse_expression("decode_sampled_requests + prefill_sampled_requests")
IS_OWNERS = m.BinaryOperation(
    left=m.Name("decode_sampled_requests"), operator=m.Add(), right=m.Name("prefill_sampled_requests")
)
PROMPT_THEN_DECODE = m.BinaryOperation(
    left=pd_info("prompt_req_ids"), operator=m.Add(), right=pd_info("decode_req_ids")
)
DECODE_THEN_PROMPT = m.BinaryOperation(left=listed("decode_req_ids"), operator=m.Add(), right=listed("prompt_req_ids"))
IN_SAMPLE = m.FunctionDef(name=m.Name("sample_tokens"))


def run_sampling_with(owners: m.BaseMatcherNode) -> m.SimpleStatementLine:
    call = m.Call(
        func=m.Attribute(value=m.Name("self"), attr=m.Name("_run_sampling")),
        args=[m.ZeroOrMore(), m.Arg(value=owners), m.ZeroOrMore()],
    )
    return m.SimpleStatementLine(body=[m.Assign(value=call)])


SAMPLING, LOGPROBS = "_run_sampling request ids", "struct_logprobs_req_ids"


class SampleRowsByOwner(Codemod):
    DESCRIPTION = (
        "Sample each row of the structured-output logits with its owner's parameters, and report its logprobs."
    )
    TARGET = TARGET
    PLACES = (SAMPLING, LOGPROBS)
    SCOPE = ("HPUModelRunner.sample_tokens",)

    @m.call_if_inside(IN_SAMPLE)
    @m.leave(run_sampling_with(PROMPT_THEN_DECODE))
    def owners_in_logits_order(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        assign = updated.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        args = [
            a.with_changes(value=OWNERS) if m.matches(a.value, PROMPT_THEN_DECODE) else a for a in assign.value.args
        ]
        new = updated.with_changes(
            body=[assign.with_changes(value=assign.value.with_changes(args=args))],
            leading_lines=[
                *updated.leading_lines,
                *comment_lines("# Row owners in logits order; a prefill chunk may own no row."),
            ],
        )
        return self.at(SAMPLING, updated, new)

    @m.call_if_inside(IN_SAMPLE)
    @m.leave(run_sampling_with(IS_OWNERS))
    def already_by_owner(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        return self.at(SAMPLING, updated, updated)

    @m.call_if_inside(IN_SAMPLE)
    @m.leave(
        m.SimpleStatementLine(
            body=[
                m.Assign(
                    targets=[m.AssignTarget(m.Name("struct_logprobs_req_ids"))], value=DECODE_THEN_PROMPT | IS_OWNERS
                )
            ]
        )
    )
    def logprobs_for_the_same_rows(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        assign = updated.body[0]
        assert isinstance(assign, cst.Assign)
        if m.matches(assign.value, IS_OWNERS):
            return self.at(LOGPROBS, updated, updated)
        return self.at(LOGPROBS, updated, updated.with_changes(body=[assign.with_changes(value=OWNERS)]))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        # Both places are whole statements, matched on leaving them: their expressions need no walk
        # (two thirds of the nodes of sample_tokens; the statement's own leave still runs).
        return False


UNFINISHED = "row of an unfinished prefill chunk"
WHY_NOT_STRUCTURED = (
    "# Not for structured output: under sync scheduling the chunk's sampled token",
    "# would be returned as generated, and use_structured_output is still the",
    "# previous step's here. Grammar masks are placed by logits-row owner.",
)


class NoRowForUnfinishedChunk(Codemod):
    """Only async scheduling needs a (discarded) row for an unfinished prefill chunk. With
    sync scheduling that row's token is returned to the scheduler as generated; and the
    structured-output flag read here was still the previous step's (sample_tokens sets it
    after _prepare_inputs). Grammar masks are placed by row owner (so-row-owners)."""

    DESCRIPTION = "An unfinished prefill chunk gets a logits row only under async scheduling."
    TARGET = TARGET
    PLACES = (UNFINISHED,)
    SCOPE = ("HPUModelRunner._extract_prefill_batch_contents",)

    @m.call_if_inside(m.FunctionDef(name=m.Name("_extract_prefill_batch_contents")))
    @m.leave(
        m.If(
            test=m.BooleanOperation(
                left=self_attr("use_async_scheduling"), operator=m.Or(), right=self_attr("use_structured_output")
            )
        )
    )
    def async_only(self, original: cst.If, updated: cst.If):
        assert isinstance(updated.test, cst.BooleanOperation)
        new = updated.with_changes(
            test=updated.test.left, leading_lines=[*updated.leading_lines, *comment_lines(*WHY_NOT_STRUCTURED)]
        )
        return self.at(UNFINISHED, updated, new)

    @m.call_if_inside(m.FunctionDef(name=m.Name("_extract_prefill_batch_contents")))
    @m.leave(
        m.If(
            test=self_attr("use_async_scheduling"),
            leading_lines=[m.ZeroOrMore(), m.EmptyLine(comment=m.Comment(WHY_NOT_STRUCTURED[-1]))],
        )
    )
    def already_async_only(self, original: cst.If, updated: cst.If):
        return self.at(UNFINISHED, updated, updated)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return False  # its place is an ``if`` statement: no simple statement's expressions need a walk
