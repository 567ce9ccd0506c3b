"""GLM_EARLY_DRAFT=1: the MTP draft of a verify step launched from the card's tensors, before the
step's tokens are read back to the host.

What vllm-gaudi's runner does (``HPUModelRunner.sample_tokens``, main 091bbad, with the port's
patches), for the decodes of a step with drafts to verify:

1. the target's forward over every verify row, then the rejection sampler (on the card with
   GLM_SPEC_DEVICE_REJECT=1: glm5_hpu/spec_device.py);
2. ``rejection_sampler.parse_output`` copies the rejection output to the host (a read of the
   card) and turns it into a list per request;
3. host bookkeeping: the tokens into ``input_batch``, each request's output list;
4. ``propose_draft_token_ids`` -> ``propose_eagle_decode``: ``HpuEagleProposer.prepare_inputs``
   finds, on the host and from the lists of step 2, which verify rows each request kept and its
   last kept row, copies those indices to the card, and only then the draft model runs;
5. after ``sample_tokens`` returns, the engine calls ``take_draft_token_ids``, which reads the
   draft tokens back to the host (a second read of the card: ``.tolist()``).

So the draft waits for the read of step 2 and the host work of steps 3 and 4, and its tokens
cost a read of their own. With GLM_EARLY_DRAFT=1, at step 2 and before anything is read: the
kept rows and the last kept row of each request are computed on the card from the rejection
output (a row is kept while its token is not the placeholder and is inside the vocabulary, the
test ``parse_output`` applies; a request without drafts keeps its one row, as
``prepare_inputs``), the draft model runs on them exactly as ``propose_eagle_decode`` runs it
(the same ``HpuEagleProposer.propose`` with the same inputs), and then the rejection output and
the draft tokens are read back together, in one copy. ``parse_output`` gets that host copy,
step 4 hands the draft tokens on without drafting again, and ``take_draft_token_ids`` finds a
host tensor: its read is gone. One read of the card per verify step instead of two, the host
index loop of ``prepare_inputs`` gone, and the draft queued right behind the target on the card.

The decoding is unchanged: the same draft model on the same tokens, positions, hidden states and
attention metadata, so the drafts, and the greedy tokens, are those of GLM_EARLY_DRAFT=0. In a
step that also runs prompts, their drafts are vLLM's, after the step, as before, and the decodes'
early drafts stay on the card to be read with them in ``take_draft_token_ids``: as many reads as
before. With vllm-gaudi's host rejection (GLM_SPEC_DEVICE_REJECT=0, and the sampled batches of
GLM_SPEC_DEVICE_REJECT=1) the rejection output is on the host already (its inputs were read to
compute it): the draft still starts before the host work of steps 3 and 4, and its tokens are
read there instead of in ``take_draft_token_ids``: as many reads as before.
Not used (vLLM's path as before): async scheduling, structured output, a step without drafts to
verify, a drafter other than vLLM's EAGLE/MTP one.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

#: the runner whose ``sample_tokens`` is running (parse_output is a static method: it is not told)
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("glm5_early_draft_runner", default=None)


@dataclass
class _Step:
    """What one ``sample_tokens`` call of a runner saw, for its decodes."""

    decode: Any = None  # DecodeInputData with spec_decode_metadata
    hidden: Any = None  # the decode forward's (non-flattened hidden states, aux hidden states)
    prefills: int = 0  # prompts in the step
    drafts: torch.Tensor | None = None  # [num_decodes, k], set once drafted early


def kept_rows(
    output_token_ids: torch.Tensor, num_draft_tokens: list[int], vocab_size: int, placeholder: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """On the card, what ``HpuEagleProposer.prepare_inputs`` computes on the host from the parsed
    lists: for the flattened verify rows (``max(num_draft_tokens) + 1`` per request), the row index
    where the request kept the row, -1 where not, and each request's last kept row."""
    width = max(num_draft_tokens) + 1
    rows = len(num_draft_tokens)
    out = output_token_ids
    assert tuple(out.shape) == (rows, width), (tuple(out.shape), rows, width)
    emitted = ((out != placeholder) & (out < vocab_size)).sum(dim=1).to(torch.int64)
    drafts = torch.tensor(num_draft_tokens, dtype=torch.int64).to(out.device)
    emitted = torch.where(drafts > 0, emitted, torch.ones_like(emitted))  # no drafts: its one row
    start = torch.arange(rows, dtype=torch.int64).to(out.device) * width
    col = torch.arange(width, dtype=torch.int64).to(out.device)
    picked = torch.where(col.unsqueeze(0) < emitted.unsqueeze(1), start.unsqueeze(1) + col.unsqueeze(0), -1)
    return picked.flatten(), start + emitted - 1


def _draft(runner, step: _Step, output_token_ids: torch.Tensor, vocab_size: int, placeholder: int) -> torch.Tensor:
    """The decodes' drafts on the card, as ``propose_eagle_decode`` makes them, with the kept rows
    from :func:`kept_rows`."""
    decode = step.decode
    meta = decode.spec_decode_metadata
    out = output_token_ids.to(runner.device)
    picked, last = kept_rows(out, list(meta.num_draft_tokens), vocab_size, placeholder)
    block_table = runner.input_batch.block_table[0].get_cpu_tensor()[: decode.num_decodes]
    hidden, aux = step.hidden
    if runner.use_aux_hidden_state_outputs and aux is not None:
        target_hidden = torch.cat([h[picked] for h in aux], dim=-1)
    else:
        target_hidden = hidden[picked]
    if target_hidden.dim() == 2:
        target_hidden = target_hidden.unsqueeze(1)
    drafts = runner.drafter.propose(
        out.reshape(-1, 1)[picked],
        decode.position_ids[picked],
        target_hidden,
        last,
        decode.attn_metadata,
        block_table,
        runner,
    )
    return drafts[: decode.num_decodes]


def _wrap(cls, name: str, make) -> None:
    original = getattr(cls, name)
    wrapped = make(original)
    functools.update_wrapper(wrapped, original)
    wrapped.__glm5_early_draft__ = True
    setattr(cls, name, wrapped)


def install() -> None:
    """Wrap vllm-gaudi's ``HPUModelRunner`` (and vLLM's ``RejectionSampler.parse_output``, which
    the runner calls) so decodes draft early. Safe to call again."""
    from vllm.v1.sample import rejection_sampler as vllm_rejection
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

    if getattr(HPUModelRunner.sample_tokens, "__glm5_early_draft__", False):
        return
    RejectionSampler = vllm_rejection.RejectionSampler

    def sample_tokens(original):
        def run(self, *args, **kwargs):
            spec = self.speculative_config
            usable = (
                spec is not None
                and spec.use_eagle()
                and not self.use_async_scheduling
                and not getattr(self, "warmup_mode", False)
            )
            self._glm5_early_step = _Step() if usable else None
            token = _current.set(self if usable else None)
            try:
                return original(self, *args, **kwargs)
            finally:
                _current.reset(token)
                self._glm5_early_step = None

        return run

    def prepare_inputs(original):
        signature = inspect.signature(original)

        def run(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            step = getattr(self, "_glm5_early_step", None)
            if step is not None:
                step.prefills = signature.bind(self, *args, **kwargs).arguments["num_prefills"]
                decode = result[1][0]
                if decode is not None and decode.spec_decode_metadata is not None:
                    step.decode = decode
            return result

        return run

    def execute_model_generic(original):
        signature = inspect.signature(original)

        def run(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            step = getattr(self, "_glm5_early_step", None)
            if step is not None and step.decode is not None:
                bound = signature.bind(self, *args, **kwargs)
                if bound.arguments["attn_metadata"] is step.decode.attn_metadata:
                    step.hidden = (result[0], result[1])
            return result

        return run

    def propose_draft_token_ids(original):
        signature = inspect.signature(original)

        def run(self, *args, **kwargs):
            step = getattr(self, "_glm5_early_step", None)
            drafts = step.drafts if step is not None else None
            if drafts is None:
                return original(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs)
            if bound.arguments.get("prefill_data") is None:
                # read already (a host tensor): take_draft_token_ids reads nothing from the card
                return drafts.view(-1, 1) if self.speculative_config.num_speculative_tokens == 1 else drafts
            # prompts finished in this step: their drafts are vLLM's, after the step
            bound.arguments["decode_data"] = None
            rest = original(*bound.args, **bound.kwargs)
            both = torch.cat([drafts.to(rest.device).to(rest.dtype).reshape(-1, rest.shape[-1]), rest], dim=0)
            return both.view(-1, 1) if self.speculative_config.num_speculative_tokens == 1 else both

        return run

    parse_output = RejectionSampler.parse_output

    def early_parse_output(output_token_ids, vocab_size, discard_req_indices=(), logprobs_tensors=None):
        runner = _current.get()
        step = getattr(runner, "_glm5_early_step", None) if runner is not None else None
        if step is None or step.decode is None or step.hidden is None or runner.use_structured_output:
            return parse_output(output_token_ids, vocab_size, discard_req_indices, logprobs_tensors)
        drafts = _draft(runner, step, output_token_ids, vocab_size, vllm_rejection.PLACEHOLDER_TOKEN_ID)
        if step.prefills:
            # prompts run in this step too: their drafts come after it, on the card, and all
            # are read together by take_draft_token_ids, as before
            step.drafts = drafts
            return parse_output(output_token_ids, vocab_size, discard_req_indices, logprobs_tensors)
        if output_token_ids.device.type == "cpu":
            # vllm-gaudi's host rejection: its output is read already; only the drafts are read
            step.drafts = drafts.cpu()
            return parse_output(output_token_ids, vocab_size, discard_req_indices, logprobs_tensors)
        # the one read of the step: the rejection output and the drafts in one copy
        both = torch.cat([output_token_ids.reshape(-1).to(torch.int64), drafts.reshape(-1).to(torch.int64)]).cpu()
        n = output_token_ids.numel()
        step.drafts = both[n:].view(drafts.shape).to(drafts.dtype)
        host = both[:n].view(output_token_ids.shape).to(output_token_ids.dtype)
        return parse_output(host, vocab_size, discard_req_indices, logprobs_tensors)

    early_parse_output.__glm5_early_draft__ = True  # type: ignore[attr-defined]
    RejectionSampler.parse_output = staticmethod(early_parse_output)
    _wrap(HPUModelRunner, "_prepare_inputs", prepare_inputs)
    _wrap(HPUModelRunner, "_execute_model_generic", execute_model_generic)
    _wrap(HPUModelRunner, "propose_draft_token_ids", propose_draft_token_ids)
    _wrap(HPUModelRunner, "sample_tokens", sample_tokens)
