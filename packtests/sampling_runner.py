"""HPUModelRunner's real sampling path on a real InputBatch, for fix tests of the sampling
rows (so-row-owners, structured-output-rows) and of sampling under speculative decoding
(glm-5-mxfp4's spec-* patches): sample_tokens and everything it calls to pick rows, build
metadata, mask and sample (and, with speculation, the spec-decode metadata and vLLM's rejection
sampler) run as released; the model forward returns logits where each request's row favours
its own token. Only hardware is taken out (pinned host memory, device tensors). Import it
inside a test that takes the ``tree`` fixture.
"""

import functools
from types import SimpleNamespace
from unittest.mock import MagicMock

VOCAB = 32


def sampling_env(monkeypatch):
    """The real modules the sampling path uses, with only hardware taken out."""
    import numpy as np
    import torch
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.sample.ops.penalties as penalties
    import vllm_gaudi.utils as gaudi_utils
    import vllm_gaudi.v1.worker.hpu_input_batch as hib
    import vllm_gaudi.v1.worker.hpu_model_runner as hmr
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.sample.sampler import Sampler

    # Hardware only: the real row update with "device" tensors on the CPU, no pinned memory.
    monkeypatch.setattr(hib, "async_h2d_update", functools.partial(gaudi_utils.async_h2d_update, device="cpu"))
    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)
    monkeypatch.setattr(penalties, "PIN_MEMORY", False)  # read at its import

    class NoPinTorch:
        """torch as the runner module sees it, minus pinned host memory (needs a card)."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(*args, pin_memory=False, **kwargs):
            return torch.tensor(*args, **kwargs)

    monkeypatch.setattr(hmr, "torch", NoPinTorch())
    # Hardware only: a copy "to the card" (the speculative path's `.to("hpu")`) stays on the CPU.
    to = torch.Tensor.to

    def to_host(self, *args, **kwargs):
        if args and args[0] == "hpu":
            args = ("cpu", *args[1:])
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_host)
    return SimpleNamespace(
        np=np,
        torch=torch,
        SamplingParams=SamplingParams,
        GrammarOutput=GrammarOutput,
        Sampler=Sampler,
        hib=hib,
        hmr=hmr,
    )


REAL = (
    "sample_tokens",
    "_run_sampling",
    "_prepare_sampling",
    "_generate_req_id_output_token_ids_lst",
    "apply_grammar_bitmask",
    "_ensure_decodes_first",
    "_is_prompt",
    "is_decoder_only",
    "_get_prompts_and_decodes",
    "_extract_prefill_batch_contents",
    "_build_logprobs_output",
    # speculative decoding: the verify rows' metadata
    "_prepare_spec_decode_inputs",
    "_get_cumsum_and_arange",
)
# Real where the tree has them (a fix adds them); a tree without them keeps the mock's.
REAL_IF_PRESENT = ("_apply_grammar_rows",)


def make_runner(e, favourite, num_spec_tokens=0, certain=False):
    """HPUModelRunner's real sampling path (sample_tokens and everything it calls to pick
    rows, build metadata, mask and sample) on a real InputBatch and vLLM Sampler; the model
    forward is replaced by logits where each request's row favours its own token.

    num_spec_tokens > 0: speculative decoding with that many draft tokens, verified by vLLM's
    RejectionSampler as HPUModelRunner.__init__ builds it; ``favourite[rid]`` may then be a
    list, the token the target favours at each of a decode's 1 + k verify positions (a
    favourite is a token, logit 10, or a {token: logit} dict). The
    drafter itself is not run (propose_draft_token_ids stays a mock).

    certain: every other token gets logit -inf, so the favourite has probability 1 at any
    temperature (sampled results are then exact)."""
    R = e.hmr.HPUModelRunner
    runner = MagicMock()
    for name in REAL:
        setattr(runner, name, getattr(R, name).__get__(runner))
    for name in REAL_IF_PRESENT:
        if hasattr(R, name):
            setattr(runner, name, getattr(R, name).__get__(runner))
    runner.input_batch = e.hib.InputBatch(
        max_num_reqs=8,
        max_model_len=128,
        max_num_batched_tokens=128,
        device=e.torch.device("cpu"),
        pin_memory=False,
        vocab_size=VOCAB,
        block_sizes=[16],
        kernel_block_sizes=[16],
    )
    runner.requests = {}
    runner.sampler = e.Sampler()
    runner.device = "cpu"
    runner.attn_block_size = 16
    runner.max_model_len = 128
    runner.use_async_scheduling = False
    runner.use_structured_output = False  # HPUModelRunner.__init__
    runner.speculative_config = None
    runner.vllm_config.speculative_config = None
    if num_spec_tokens:
        # What the HPU platform's register_ops() imports: vllm-gaudi's rejection sampling ops,
        # which replace vLLM's Triton ones in vllm.v1.sample.rejection_sampler.
        import vllm_gaudi.v1.sample.hpu_rejection_sampler  # noqa: F401
        from vllm.v1.sample.rejection_sampler import RejectionSampler

        runner.speculative_config = SimpleNamespace(num_speculative_tokens=num_spec_tokens, method="mtp")
        runner.vllm_config.speculative_config = runner.speculative_config
        runner.rejection_sampler = RejectionSampler(runner.sampler)
        runner.arange_np = e.np.arange(1024, dtype=e.np.int64)
    runner.is_driver_worker = False
    runner.profiler.enabled = False
    runner.use_aux_hidden_state_outputs = False
    runner._configure_lora.return_value = (None, None)
    runner._get_model_mm_inputs.return_value = (None, {})
    runner._get_attention_group_id_for_hybrid.return_value = 0
    runner._can_merge_prefill_contents.return_value = False
    runner.get_dp_padding.return_value = 0
    runner._get_prompt_logprobs_dict.return_value = {}

    def prepare_inputs(so, num_prefills, num_decodes, warmup=False):
        # The real choice of logits rows (_extract_prefill_batch_contents); ids, positions and
        # attention metadata are not needed by a fake forward.
        ib = runner.input_batch
        sched = [so.num_scheduled_tokens[r] for r in ib.req_ids[: num_prefills + num_decodes]]
        contents, _ = runner._extract_prefill_batch_contents(num_prefills, num_decodes, sched, warmup=True)
        pre = e.hmr.PrefillInputData()
        for c in contents:
            if not c.req_ids:
                continue
            owners = [r for r, pos in zip(c.req_ids, c.logits_positions, strict=True) for _ in pos]
            for lst, v in (
                (pre.request_ids, c.req_ids),
                (pre.prompt_lens, c.prompt_lens),
                (pre.token_ids, e.torch.zeros(1, 1)),
                (pre.position_ids, None),
                (pre.attn_metadata, None),
                (pre.logits_indices, owners),
                (pre.logits_requests, owners),
            ):
                lst.append(v)
        dec = None
        if num_decodes:
            owners = list(ib.req_ids[:num_decodes])
            owners += [owners[0]] * (4 - len(owners))  # a padded decode bucket
            if not num_spec_tokens:
                dec = e.hmr.DecodeInputData(
                    num_decodes=num_decodes, token_ids=e.torch.zeros(4, 1), logits_indices=owners
                )
            else:
                dec = spec_decode_input(owners, so, num_decodes)
        return (pre, None), (dec, None)

    def spec_decode_input(owners, so, num_decodes):
        # As _prepare_decode_inputs lays out a speculative decode batch: 1 + k rows per request
        # of the padded bucket (its last token, then its drafts), and the real spec-decode
        # metadata built from them. Row i of request b is (owner, position i).
        width = 1 + num_spec_tokens
        ids = e.torch.zeros(len(owners) * width, 1, dtype=e.torch.int64)
        for b, rid in enumerate(owners[:num_decodes]):
            drafts = so.scheduled_spec_decode_tokens.get(rid, [])
            ids[b * width + 1 : b * width + 1 + len(drafts), 0] = e.torch.tensor(drafts)
        _, meta = runner._prepare_spec_decode_inputs(so, e.torch.zeros(len(owners)), ids, width)
        rows = [(rid, i) for rid in owners for i in range(width)]
        return e.hmr.DecodeInputData(
            num_decodes=num_decodes, token_ids=ids, logits_indices=rows, spec_decode_metadata=meta
        )

    def forward(token_ids, position_ids, attn_metadata, owners, *args, **kwargs):
        logits = e.torch.full((len(owners), VOCAB), float("-inf") if certain else 0.0)
        for row, owner in enumerate(owners):
            rid, pos = owner if isinstance(owner, tuple) else (owner, 0)
            fav = favourite[rid]
            fav = fav[pos] if isinstance(fav, list) else fav
            for tok, value in fav.items() if isinstance(fav, dict) else [(fav, 10.0)]:
                logits[row, tok] = value
        return e.torch.zeros(len(owners), 1), None, None, logits

    runner._prepare_inputs.side_effect = prepare_inputs
    runner._execute_model_generic.side_effect = forward
    return runner


def add(e, runner, rid, prompt_len, **sp):
    state = e.hib.CachedRequestState(
        req_id=rid,
        prompt_token_ids=list(range(1, prompt_len + 1)),
        mm_features=[],
        sampling_params=e.SamplingParams(**sp),
        generator=None,
        block_ids=[[0] * 8],
        num_computed_tokens=0,
        output_token_ids=[],
    )
    runner.requests[rid] = state
    runner.input_batch.add_request(state)


def run_step(e, runner, scheduled, computed, grammar=None, batch_changed=False, drafts=None):
    """One engine step: computed tokens as _update_states sets them, then sample_tokens.
    grammar: {req_id: allowed token} for the structured-output requests the scheduler masks, or
    {req_id: [allowed token per mask row]}: under speculation the scheduler sends 1 + len(drafts)
    rows per request (its grammar advanced over each draft).
    drafts: {req_id: draft tokens} the scheduler sends for verification (speculative decoding;
    each such request is scheduled 1 + len(drafts) tokens)."""
    ib = runner.input_batch
    for rid, n in computed.items():
        ib.num_computed_tokens_cpu[ib.req_id_to_index[rid]] = n
    runner.scheduler_output = SimpleNamespace(
        num_scheduled_tokens=dict(scheduled),
        scheduled_spec_decode_tokens=dict(drafts or {}),
        total_num_scheduled_tokens=sum(scheduled.values()),
        kv_connector_metadata=None,
    )
    runner.warmup_mode = True  # skips only the KV-connector calls around the forward
    runner.batch_changed = batch_changed
    grammar_output = None
    if grammar:
        ids = list(grammar)
        rows = [tok for rid in ids for tok in (grammar[rid] if isinstance(grammar[rid], list) else [grammar[rid]])]
        bitmask = e.np.zeros((len(rows), (VOCAB + 31) // 32), dtype=e.np.int32)
        for i, tok in enumerate(rows):
            bitmask[i, tok // 32] = e.np.int32(e.np.uint32(1 << (tok % 32)).view(e.np.int32))
        grammar_output = e.GrammarOutput(ids, bitmask)
    out = runner.sample_tokens(grammar_output)
    runner.last_output = out  # the whole ModelRunnerOutput (logprobs), for tests that read it
    return {rid: out.sampled_token_ids[out.req_id_to_index[rid]] for rid in out.req_ids}
