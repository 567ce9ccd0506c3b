"""Async scheduling on HPU: (1) each decode's input id is the token it actually has: the one
sampled on the device in the previous step, or, for a request that was not in that step
(re-added after an unscheduled step, resumed), the one in the CPU batch; never a stale value
of the device buffer. (2) The previous step's tokens reach the output history that the
penalties read.

The real InputBatch and the runner's real _prepare_inputs / _prepare_sampling run on CPU;
the host-to-device copy helper is pointed at the CPU (the only hardware stand-in).
"""

from types import SimpleNamespace

import numpy as np
import pytest

BLOCK = 4
STALE = 777  # what the device input-id buffer holds from an older step


@pytest.fixture()
def env(tree, monkeypatch):
    import torch
    import vllm_gaudi.v1.worker.hpu_model_runner as hmr
    from vllm.sampling_params import SamplingParams
    from vllm_gaudi.v1.worker.hpu_input_batch import CachedRequestState, InputBatch

    real_copy = hmr.async_h2d_copy

    def cpu_copy(source, dest_tensor=None, dtype=None, device="hpu"):
        return real_copy(source, dest_tensor, dtype, device="cpu")

    monkeypatch.setattr(hmr, "async_h2d_copy", cpu_copy)

    import vllm.utils.torch_utils as torch_utils
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

    # No pinned host memory (vLLM's platform probe says yes on this CPU-only machine, torch says no).
    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)

    # The runner builds the batch with vLLM's builtin logits processors; min_tokens is the one
    # that reads the output history (fed by logitsprocs-rows).
    procs = LogitsProcessors([MinTokensLogitsProcessor(SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8)),
                                                       torch.device("cpu"), False)])
    batch = InputBatch(max_num_reqs=8, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       pin_memory=False, vocab_size=1000, block_sizes=[BLOCK], kernel_block_sizes=[BLOCK],
                       logitsprocs=procs)
    runner = object.__new__(hmr.HPUModelRunner)
    max_tokens = 64
    runner.__dict__.update(
        input_batch=batch,
        requests={},
        device=torch.device("cpu"),
        pin_memory=False,
        use_async_scheduling=True,
        use_structured_output=False,
        invalid_req_indices=[],
        num_mamba_like_layers=0,
        attn_block_size=BLOCK,
        uses_mrope=False,
        use_contiguous_pa=False,
        interleaved_sliding_window=False,
        model_has_chunked_attention=False,
        _PAD_BLOCK_ID=0,
        model_config=SimpleNamespace(dtype=torch.bfloat16),
        bucketing_manager=SimpleNamespace(find_decode_bucket=lambda bs, blocks, *a: (bs, 1, max(blocks, 1))),
        get_dp_padding=lambda n: 0,
        arange_np=np.arange(max_tokens, dtype=np.int64),
        input_ids_cpu=torch.zeros(max_tokens, dtype=torch.int32),
        positions_cpu=torch.zeros(max_tokens, dtype=torch.int64),
        input_ids_hpu=torch.full((max_tokens, ), STALE, dtype=torch.int32),
    )
    runner.positions_np = runner.positions_cpu.numpy()

    def add(req_id, outputs, computed=None, penalty=0.0, **params):
        prompt = list(range(10, 16))
        params = SamplingParams(max_tokens=32, presence_penalty=penalty, **params)
        state = CachedRequestState(req_id=req_id, prompt_token_ids=prompt, mm_features=[], sampling_params=params,
                                   generator=None, block_ids=[list(range(1, 9))],
                                   num_computed_tokens=len(prompt) + len(outputs) - 1 if computed is None else computed,
                                   output_token_ids=list(outputs))
        runner.requests[req_id] = state
        batch.add_request(state)

    def previous_step(tokens_by_req):
        """What sample_tokens leaves behind in async mode: the device tokens by row."""
        rows = list(tokens_by_req)
        batch.prev_sampled_token_ids = torch.tensor([tokens_by_req[r] for r in rows], dtype=torch.int32)
        batch.prev_req_id_to_index = {r: i for i, r in enumerate(rows)}
        batch.prev_sampled_token_ids_invalid_indices = set()
        # The device buffer keeps the previous ids at their old positions; the rest is stale.
        runner.input_ids_hpu[:] = STALE

    def decode_input_ids(num_scheduled):
        sched = SimpleNamespace(num_scheduled_tokens=num_scheduled,
                                total_num_scheduled_tokens=sum(num_scheduled.values()),
                                scheduled_spec_decode_tokens={})
        _, (decode, _) = runner._prepare_inputs(sched, 0, batch.num_reqs)
        return decode.token_ids.flatten()[:batch.num_reqs].tolist()

    return SimpleNamespace(batch=batch, runner=runner, add=add, previous_step=previous_step,
                           decode_input_ids=decode_input_ids)


def test_readded_decode_keeps_its_cpu_token(env):
    # a and b decoded in the previous step (tokens 501, 502 still on the device); c was not
    # scheduled in that step and is added back with its last token (303) from the scheduler.
    env.add("a", [101])
    env.add("b", [201])
    env.add("c", [301, 302, 303])
    env.previous_step({"a": 501, "b": 502})
    ids = env.decode_input_ids({"a": 1, "b": 1, "c": 1})
    assert ids[:2] == [501, 502]
    assert ids[2] == 303, f"re-added decode fed {ids[2]} (stale device buffer) instead of its last token 303"


def test_first_async_step_takes_the_cpu_tokens(env):
    # No step has sampled on the device yet (prev_sampled_token_ids is None): every decode's
    # input id is the one in the CPU batch.
    env.add("a", [101])
    env.add("b", [201, 202])
    assert env.batch.prev_sampled_token_ids is None
    env.runner.input_ids_hpu[:] = STALE
    assert env.decode_input_ids({"a": 1, "b": 1}) == [101, 202]


def test_no_request_in_common_uses_cpu_tokens(env):
    env.add("c", [301, 302])
    env.add("d", [401])
    env.previous_step({"gone": 999})
    assert env.decode_input_ids({"c": 1, "d": 1}) == [302, 401]


def test_reordered_batch(env):
    env.add("a", [101])
    env.add("c", [303])
    env.add("b", [201])
    env.previous_step({"b": 502, "a": 501})  # b was row 0 in the previous step
    assert env.decode_input_ids({"a": 1, "c": 1, "b": 1}) == [501, 303, 502]


def test_all_decodes_from_device(env):
    env.add("a", [101])
    env.add("b", [201])
    env.previous_step({"a": 501, "b": 502})
    assert env.decode_input_ids({"a": 1, "b": 1}) == [501, 502]


def test_penalties_see_previous_step_tokens(env):
    # Request p (presence penalty) sampled 42 then 43 in the two previous steps; q has no penalty.
    env.add("p", [], computed=6, penalty=1.0)
    env.add("q", [], computed=6)
    seen = []
    for step, (tok_p, tok_q) in enumerate([(42, 7), (43, 8)]):
        env.previous_step({"p": tok_p, "q": tok_q})
        # A step samples more than once (prefill batches, decode batch): no double counting.
        for _ in range(2):
            meta = env.runner._prepare_sampling(False, ["p", "q"], 2)
        seen.append(list(meta.output_token_ids[0]))
    assert seen == [[42], [42, 43]], f"output history the penalties see for p: {seen}"


def test_readded_request_takes_the_schedulers_history(env, monkeypatch):
    import vllm_gaudi.v1.worker.hpu_model_runner as hmr
    from vllm.v1.core.sched.output import CachedRequestData

    # Guards the re-add path the history change relies on: on the pristine tree the worker
    # never appends to the history, so this state is set by hand here.
    # r's history got a token appended by the worker (penalties were on), then the scheduler
    # discarded that token (it was in flight when r was preempted) and re-adds r with no outputs.
    env.add("r", [], computed=6, penalty=1.0)
    env.runner.requests["r"].output_token_ids.append(55)
    env.batch.remove_request("r")
    env.batch.condense([0])
    monkeypatch.setattr(hmr, "get_pp_group", lambda: SimpleNamespace(is_last_rank=True))
    env.runner.__dict__.update(encoder_cache={}, _compact_gdn_group_ids=[])
    cached = CachedRequestData(req_ids=["r"], resumed_req_ids={"r"}, new_token_ids=[], all_token_ids={"r": list(
        range(10, 16))}, new_block_ids=[([1, 2], )], num_computed_tokens=[0], num_output_tokens=[0])
    sched = SimpleNamespace(finished_req_ids=set(), free_encoder_mm_hashes=[], num_scheduled_tokens={"r": 6},
                            scheduled_new_reqs=[], scheduled_cached_reqs=cached, scheduled_spec_decode_tokens={})
    env.runner._update_states(sched)
    index = env.batch.req_id_to_index["r"]
    assert env.runner.requests["r"].output_token_ids == []
    assert env.batch.num_tokens[index] == 6


def test_min_tokens_lets_stop_tokens_through_once_reached(env):
    # With logitsprocs-rows, vLLM's MinTokens processor masks a request's stop tokens while its
    # output history is shorter than min_tokens. In async mode that history must advance, or the
    # stop tokens stay masked for the whole generation.
    import torch
    from vllm.v1.sample.sampler import Sampler

    stop, other = 5, 6
    env.add("m", [], computed=6, min_tokens=2, stop_token_ids=[stop], temperature=0.0)
    env.batch.refresh_sampling_metadata()
    picked = []
    for step, tok in enumerate([other, other, other]):
        env.previous_step({"m": tok})
        meta = env.runner._prepare_sampling(False, ["m"], 1)
        logits = torch.zeros(1, 1000)
        logits[0, stop], logits[0, other] = 10.0, 9.0
        picked.append(Sampler()(logits, meta).sampled_token_ids.flatten().tolist()[0])
    # Histories before each call: [6] (1 < 2: masked), [6, 6] and [6, 6, 6] (reached: allowed).
    assert picked == [other, stop, stop], f"tokens picked with min_tokens=2 over three async steps: {picked}"
