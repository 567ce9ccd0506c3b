"""A worker that fails on a tensor-parallel rank whose reply nobody reads must not carry on
a step behind its peers: its busy loop ends with the error, the worker process exits, and
the executor's worker monitor tells the engine. The message queues are fakes (shared memory
queues between real processes are the executor's plumbing, not what is under test); every
wait is bounded, so the pristine tree fails fast instead of hanging."""

import multiprocessing
import threading
import time
import types

import pytest

OUTPUT_RANK = 0
FAILING_RANK = 1


class QueueDrained(Exception):
    """Raised by the fake broadcast queue once the scripted messages are used up."""


class FakeBroadcastQueue:
    def __init__(self, messages, block_when_drained=0.0):
        self.messages = list(messages)
        self.block_when_drained = block_when_drained

    def dequeue(self, timeout=None, indefinite=False, **kwargs):
        if self.messages:
            return self.messages.pop(0)
        # A real queue would wait for the next step here; wait a bounded time, then stop.
        time.sleep(self.block_when_drained)
        raise QueueDrained("no more scripted messages")

    def wait_until_ready(self):
        pass

    def shutdown(self):
        pass


class FakeResponseQueue:
    def __init__(self):
        self.items = []

    def enqueue(self, item):
        self.items.append(item)

    def export_handle(self):
        return None

    def wait_until_ready(self):
        pass

    def shutdown(self):
        pass


class FakeWorker:
    """Stands in for the model worker: execute_model fails on this rank."""

    def __init__(self, fail):
        self.fail = fail
        self.calls = 0

    def execute_model(self, step):
        self.calls += 1
        if self.fail:
            raise RuntimeError(f"device error on rank {FAILING_RANK} at step {step}")
        return f"output of step {step}"

    def shutdown(self):
        pass


def two_steps():
    # Two execute_model steps; only the output rank is asked to reply (as for TP > 1
    # without a KV connector: MultiprocExecutor.execute_model, unique_reply_rank).
    return [("execute_model", (0,), {}, OUTPUT_RANK), ("execute_model", (1,), {}, OUTPUT_RANK)]


def make_proc(WorkerProc, rank, worker, messages):
    proc = object.__new__(WorkerProc)
    proc.rank = rank
    proc.worker = worker
    proc.use_async_scheduling = False
    proc.rpc_broadcast_mq = FakeBroadcastQueue(messages)
    proc.worker_response_mq = FakeResponseQueue()
    proc.peer_response_handles = []
    return proc


def run_loop_bounded(proc, timeout=20.0):
    """Run the real busy loop in a thread; return the exception that ended it."""
    outcome = {}

    def target():
        try:
            proc.worker_busy_loop()
        except BaseException as e:  # noqa: BLE001 - the outcome is what the test checks
            outcome["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "worker_busy_loop did not return within the time bound"
    return outcome.get("error")


def test_failing_non_output_rank_stops_its_loop_with_the_error(tree):
    from vllm.v1.executor.multiproc_executor import WorkerProc

    worker = FakeWorker(fail=True)
    proc = make_proc(WorkerProc, FAILING_RANK, worker, two_steps())
    error = run_loop_bounded(proc)

    assert not isinstance(error, QueueDrained), (
        "the non-output rank logged the error and went on to the next step: "
        f"it ran execute_model {worker.calls} times while its peers saw no failure"
    )
    assert isinstance(error, RuntimeError) and "device error on rank 1 at step 0" in str(error)
    assert worker.calls == 1, "the rank must not run further steps after it failed"
    # It still never writes to its response queue: nobody reads it.
    assert proc.worker_response_mq.items == []

    # Unchanged by the fix: the output rank's error reaches the executor as a FAILURE
    # reply and that rank keeps serving.
    worker = FakeWorker(fail=True)
    proc = make_proc(WorkerProc, OUTPUT_RANK, worker, two_steps())
    error = run_loop_bounded(proc)
    assert isinstance(error, QueueDrained)
    statuses = [status for status, _ in proc.worker_response_mq.items]
    assert statuses == [WorkerProc.ResponseStatus.FAILURE] * 2

    # And a healthy non-output rank runs every step without replying.
    worker = FakeWorker(fail=False)
    proc = make_proc(WorkerProc, FAILING_RANK, worker, two_steps())
    assert isinstance(run_loop_bounded(proc), QueueDrained)
    assert worker.calls == 2 and proc.worker_response_mq.items == []


def test_engine_is_told_when_a_non_output_rank_fails(tree):
    """Real worker_main in a forked process, real MultiprocExecutor worker monitor."""
    import vllm.v1.executor.multiproc_executor as mpe

    RealWorkerProc = mpe.WorkerProc

    class ScriptedWorkerProc(RealWorkerProc):
        # Builds the fake worker and queues instead of a device worker.
        def __init__(self, *args, rank, **kwargs):
            self.rank = rank
            self.worker = FakeWorker(fail=True)
            self.use_async_scheduling = False
            # Once drained, a pristine loop would wait for the next step: hold it there
            # (bounded) so the monitor cannot see the process end for the wrong reason.
            self.rpc_broadcast_mq = FakeBroadcastQueue(two_steps(), block_when_drained=60.0)
            self.worker_response_mq = FakeResponseQueue()
            self.peer_response_handles = []

    ctx = multiprocessing.get_context("fork")
    ready_reader, ready_writer = ctx.Pipe(duplex=False)
    vllm_config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(assigned_physical_gpu_ids=None, numa_bind=False)
    )

    saved = mpe.WorkerProc
    mpe.WorkerProc = ScriptedWorkerProc  # worker_main builds `WorkerProc(...)` by name
    try:
        child = ctx.Process(
            target=RealWorkerProc.worker_main,
            kwargs=dict(vllm_config=vllm_config, local_rank=FAILING_RANK, rank=FAILING_RANK,
                        ready_pipe=ready_writer, death_pipe=None),
            daemon=True,
        )
        child.start()
    finally:
        mpe.WorkerProc = saved
    ready_writer.close()

    try:
        assert ready_reader.poll(30), "worker process never became ready"
        assert ready_reader.recv()["status"] == RealWorkerProc.READY_STR

        executor = object.__new__(mpe.MultiprocExecutor)
        executor.is_failed = False
        executor.workers = [types.SimpleNamespace(proc=child, death_writer=None, worker_response_mq=None)]
        told = threading.Event()
        executor.failure_callback = told.set
        executor.start_worker_monitor()

        assert told.wait(20), (
            "the engine was never told: the rank that failed is still running, a step "
            "behind its peers"
        )
        assert executor.is_failed
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)
