"""A spurious HPU frame for a partially prefilled request is dropped without crashing the
engine, and it uses up one pending discard of vLLM 0.26.0's counter."""

import pytest


@pytest.fixture()
def scheduler_and_request(tree):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    from vllm_gaudi.v1.core.sched.hpu_async_scheduler import HPUAsyncScheduler

    # The branch under test returns before anything that needs the scheduler's state.
    scheduler = object.__new__(HPUAsyncScheduler)
    request = Request("r0", [1, 2, 3, 4], SamplingParams(max_tokens=8), None)
    assert request.num_output_placeholders == 0
    return scheduler, request


@pytest.mark.red_raises("AttributeError")
def test_spurious_frame_is_dropped_without_error(scheduler_and_request):
    scheduler, request = scheduler_and_request
    tokens, stopped = scheduler._update_request_with_output(request, [42])
    assert (tokens, stopped) == ([], False)
    assert list(request.output_token_ids) == []


@pytest.mark.red_raises("AttributeError")
def test_dropping_a_frame_drains_one_pending_discard(scheduler_and_request):
    scheduler, request = scheduler_and_request
    request.async_tokens_to_discard = 2
    scheduler._update_request_with_output(request, [42])
    assert request.async_tokens_to_discard == 1
    scheduler._update_request_with_output(request, [43])
    scheduler._update_request_with_output(request, [44])
    assert request.async_tokens_to_discard == 0
    assert list(request.output_token_ids) == []
