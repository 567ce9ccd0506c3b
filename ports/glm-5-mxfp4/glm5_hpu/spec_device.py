"""GLM_SPEC_DEVICE_REJECT=1: speculative decoding's greedy rejection on the card.

vllm-gaudi's greedy rejection (``rejection_sample_pytorch`` in vllm_gaudi/v1/sample/
hpu_rejection_sampler.py, main 091bbad) first copies its four inputs to the host ("CPU processing
is faster than HPU for this step"), four host synchronisations per decode step, then works with
boolean-mask indexing and a data-dependent branch. :func:`greedy_rejection` gives the same
output, element for element, with shapes fixed by the batch alone: comparisons, an argmax and
selects on the card, nothing read back. The caller reads the result when it hands the tokens to
the scheduler.

Its output, as vllm-gaudi's: per request, [max_drafts + 1] int32, the target's tokens up to and
including the first draft that differs from them (only at the request's real draft positions;
a padded draft counts as a difference), then the bonus token at position ``num_drafts`` when no
real draft differed (a request with no drafts always gets its bonus at 0); the placeholder
elsewhere.
"""

from __future__ import annotations

import torch


def greedy_rejection(
    draft_ids: torch.Tensor,
    target_ids: torch.Tensor,
    bonus_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    placeholder: int,
) -> torch.Tensor:
    """draft_ids [n * k] or [n * k, 1], target_ids [n * k], bonus_ids [n, 1], cu_num_draft_tokens
    [n] (cumulative real drafts per request) -> int32 [n, k + 1], on the inputs' device."""
    n = cu_num_draft_tokens.shape[0]
    drafts = draft_ids.reshape(n, -1).to(torch.int32)
    k = drafts.shape[1]
    targets = target_ids.reshape(n, k).to(torch.int32)
    bonus = bonus_ids.reshape(n, 1).to(torch.int32)
    cu = cu_num_draft_tokens.to(torch.int64)
    num_drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    pos = torch.arange(k, device=drafts.device)
    valid = pos < num_drafts.unsqueeze(-1)
    differs = drafts != targets
    any_differs = differs.any(dim=1) & (num_drafts != 0)
    first = torch.argmax(differs.to(torch.int32), dim=1)
    accepted = torch.where(any_differs, first + 1, num_drafts)
    keep = (pos < accepted.unsqueeze(-1)) & valid
    fill = torch.full_like(targets, placeholder)
    out = torch.cat([torch.where(keep, targets, fill), fill[:, :1]], dim=1)
    col = torch.arange(k + 1, device=drafts.device)
    put_bonus = (~any_differs).unsqueeze(-1) & (col == num_drafts.unsqueeze(-1))
    return torch.where(put_bonus, bonus.expand(n, k + 1), out)


def install() -> None:
    """Route greedy batches of vLLM's rejection sampler (the module function vLLM's
    RejectionSampler calls, which vllm-gaudi's hpu_rejection_sampler replaced) to
    :func:`greedy_rejection`; a batch with any sampled request keeps vllm-gaudi's path (its
    random rejection, the port's patch spec-sampling-random). Safe to call again."""
    from vllm.v1.sample import rejection_sampler
    from vllm_gaudi.v1.sample import hpu_rejection_sampler as gaudi

    if getattr(rejection_sampler.rejection_sample, "__glm5_device__", False):
        return

    def rejection_sample(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_probs,
        bonus_token_ids,
        sampling_metadata,
        *args,
        **kwargs,
    ):
        if not sampling_metadata.all_greedy:
            return gaudi.rejection_sample(
                draft_token_ids,
                num_draft_tokens,
                max_spec_len,
                cu_num_draft_tokens,
                draft_probs,
                target_probs,
                bonus_token_ids,
                sampling_metadata,
                *args,
                **kwargs,
            )
        return greedy_rejection(
            draft_token_ids,
            target_probs.argmax(dim=-1),
            bonus_token_ids,
            cu_num_draft_tokens,
            gaudi.PLACEHOLDER_TOKEN_ID,
        )

    rejection_sample.__glm5_device__ = True  # type: ignore[attr-defined]
    rejection_sampler.rejection_sample = rejection_sample
