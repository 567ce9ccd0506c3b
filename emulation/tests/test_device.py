"""The emulated card's device layer: creation, transfers, the index semantics (card tensors only),
host-sync counting, HPU-graph regions and card memory. Plain PyTorch references throughout."""

import pytest
import torch

import hpu_emulation

hpu_emulation.activate()
import habana_frameworks.torch as htorch  # noqa: E402

from hpu_emulation import counting, device, memory  # noqa: E402


def test_creation_and_transfer_keep_the_card_and_copy_to_host():
    x = torch.zeros(3, device="hpu")
    assert isinstance(x, device.HPUTensor) and x.device == torch.device("hpu", 0)
    y = torch.arange(6.0).view(2, 3).to("hpu")
    assert y.device.type == "hpu" and y.shape == torch.Size([2, 3])
    assert torch.equal((y * 2).cpu(), torch.arange(6.0).view(2, 3) * 2)
    host = y.cpu()
    host.add_(100)  # a host copy never aliases card memory
    assert y.cpu()[0, 0].item() == 0.0
    assert torch.arange(4, device="hpu").tolist() == [0, 1, 2, 3]


def test_pinned_host_memory_is_host_memory_the_card_copies_from():
    """vllm-gaudi asks for pinned host tensors (apply_grammar_bitmask's mask rows); a CPU build of
    torch pins only through a CUDA driver, so the emulation gives plain host tensors."""
    rows = torch.tensor([2, 0], dtype=torch.int32, device="cpu", pin_memory=True)
    assert rows.device.type == "cpu" and not isinstance(rows, device.HPUTensor) and rows.tolist() == [2, 0]
    assert torch.empty(3, pin_memory=True).shape == (3,)
    assert rows.to("hpu", non_blocking=True).cpu().tolist() == [2, 0]


def test_module_to_hpu_keeps_parameter_classes():
    class Tagged(torch.nn.Parameter):
        pass

    m = torch.nn.Linear(3, 2).to("hpu")
    assert isinstance(m.weight, torch.nn.Parameter) and m.weight.device.type == "hpu"
    p = Tagged(torch.ones(2).to("hpu"), requires_grad=False)
    assert isinstance(p, Tagged) and isinstance(p, device.HPUTensor)
    with torch.no_grad():
        out = m(torch.ones(1, 3, device="hpu"))
    ref = torch.nn.functional.linear(torch.ones(1, 3), m.weight.cpu(), m.bias.cpu())
    assert torch.allclose(out.cpu(), ref)


@pytest.mark.parametrize("op", ["index_select", "embedding", "index_copy_", "index_reduce_"])
def test_negative_index_wraps_to_last_row_on_the_card_only(op):
    table = torch.arange(12.0).view(4, 3)
    index = torch.tensor([0, -1, 2])
    wrapped = torch.tensor([0, 3, 2])
    source = torch.full((3, 3), 7.0)

    def run(t, i):
        if op == "index_select":
            return t.index_select(0, i)
        if op == "embedding":
            return torch.nn.functional.embedding(i, t)
        if op == "index_copy_":
            return t.clone().index_copy_(0, i, source.to(t.device))
        return t.clone().index_reduce_(0, i, source.to(t.device), "amax")

    got = run(table.to("hpu"), index.to("hpu")).cpu()
    assert torch.equal(got, run(table, wrapped))
    with pytest.raises((IndexError, RuntimeError)):
        run(table, index)  # host tensors keep the CPU's semantics


def test_one_hot_out_of_range_is_a_zero_row_on_the_card_only():
    classes = torch.tensor([0, 2, 3, -1])
    got = torch.nn.functional.one_hot(classes.to("hpu"), 3).cpu()
    assert got.tolist() == [[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]]
    with pytest.raises(RuntimeError):
        torch.nn.functional.one_hot(classes, 3)


def test_host_syncs_are_counted_with_their_place_and_graph_region():
    x = torch.tensor([1, 0, 2], device="hpu")
    with counting.step("probe") as step:
        x.sum().item()
        with counting.graph_region():
            x.nonzero()
            x[x > 0]
            x.tolist()
        counting.mark_step()
        x + 1
    reasons = [s.reason for s in step.syncs]
    assert reasons == [".item()", "nonzero", "boolean-mask indexing", ".tolist()"]
    assert [s.in_graph for s in step.syncs] == [False, True, True, True]
    assert all(s.where.startswith(__file__) for s in step.syncs)
    assert step.marks == 1 and step.graph_calls == 1 and step.segments[-1] >= 1


def test_current_step_is_the_open_one():
    assert counting.current_step() is None
    with counting.step("outer") as outer:
        assert counting.current_step() is outer
        with counting.step("inner") as inner:
            assert counting.current_step() is inner
        assert counting.current_step() is outer
    assert counting.current_step() is None


def test_strict_mode_raises_on_a_sync_inside_a_graph():
    x = torch.tensor([1.0], device="hpu")
    counting.strict(True)
    try:
        with counting.step("strict"), counting.graph_region():
            with pytest.raises(counting.HostSyncInGraph, match=r"\.item\(\)"):
                x.item()
        with counting.step("strict outside"):
            x.item()  # outside a captured region: counted, allowed
    finally:
        counting.strict(False)


def test_wrap_in_hpu_graph_counts_graph_calls_and_honours_bypass(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    m = htorch.hpu.wrap_in_hpu_graph(torch.nn.Linear(2, 2).to("hpu"))
    x = torch.ones(1, 2, device="hpu")
    with counting.step("graph") as step, torch.no_grad():
        m.forward(x)
        m.forward(x, bypass_hpu_graphs=True)
    assert step.graph_calls == 1


def test_card_memory_by_purpose_and_out_of_memory(monkeypatch):
    before = memory.stats()
    with memory.purpose("kv_cache"):
        kv = torch.empty(1024, 1024, device="hpu")  # 4 MiB
    assert memory.stats()["kv_cache"] - before["kv_cache"] == 4 << 20
    view = kv[:10]  # a view is not a second allocation
    assert memory.stats()["kv_cache"] - before["kv_cache"] == 4 << 20
    del kv, view
    assert memory.stats()["kv_cache"] == before["kv_cache"]
    free, total = torch.hpu.mem_get_info()
    assert total == 96 * 10**9 and free == total - memory.allocated()
    monkeypatch.setenv("HPU_EMULATION_MEMORY", str(memory.allocated() + (1 << 20)))
    with pytest.raises(torch.OutOfMemoryError, match=r"out of card memory .* weights"):
        with memory.purpose("weights"):
            torch.empty(1 << 20, device="hpu")


def test_a_card_tensor_collected_inside_an_allocation_does_not_deadlock():
    # A garbage collection can start inside an allocation, while the ledger's lock is held, and run
    # a card tensor's finalizer there (this hung CI once). Collect one with the lock held, from a
    # second thread so that a finalizer that waits on the lock fails the test instead of hanging it.
    import gc
    import threading

    gc.collect()  # earlier tests' garbage off the ledger first
    before = memory.stats()["workspace"]
    box = [torch.empty(256, 1024, device="hpu")]  # 1 MiB
    box.append(box)  # a cycle: only the collector frees it
    assert memory.stats()["workspace"] - before == 1 << 20
    del box
    done = threading.Event()

    def collect_with_the_lock_held():
        with memory._lock:
            gc.collect()
        done.set()

    threading.Thread(target=collect_with_the_lock_held, daemon=True).start()
    assert done.wait(30), "a card tensor's finalizer waited on the ledger's lock"
    assert memory.stats()["workspace"] == before  # the queued release was taken off


def test_device_type_follows_the_declared_card(monkeypatch):
    from habana_frameworks.torch.utils import experimental as htexp

    monkeypatch.setenv("HPU_EMULATION_DEVICE", "gaudi3")
    assert htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi3
    assert torch.hpu.mem_get_info()[1] == 128 * 10**9
    monkeypatch.setenv("HPU_EMULATION_DEVICE", "gaudi2")
    assert htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi2


def test_what_is_not_emulated_says_so():
    with pytest.raises(NotImplementedError, match="torch.hpu.some_api is not emulated"):
        torch.hpu.some_api  # noqa: B018
    assert not hasattr(torch.hpu, "some_api")
    with pytest.raises(NotImplementedError):
        htorch.hpu.graphs.HPUGraph()


def test_hccl_and_hpu_backend_are_registered():
    import torch.distributed as dist

    assert "hccl" in dist.Backend.backend_list
    fn = torch.compile(lambda a: a * 2, backend="hpu_backend")
    assert torch.equal(fn(torch.ones(2)), torch.full((2,), 2.0))


def test_device_gate_logic_on_the_emulation(monkeypatch, capsys):
    """The card gate's own logic: it passes on the emulation and fails when an assumption is dropped."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "device_gate", device.__file__.replace("hpu_emulation/device.py", "device_gate.py")
    )
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    assert gate.main(["--emulated"]) == 0
    assert gate.main([]) == 2  # the emulation is not a card: nothing checked
    monkeypatch.setattr(device, "_wrap_negative", lambda index, size: index)
    assert gate.main(["--emulated"]) == 1
    assert '"index_select": "raised' in capsys.readouterr().out


def test_an_op_registered_for_the_hpu_key_only_runs_on_card_tensors():
    """vLLM registers its custom ops for the platform's dispatch key (HPU under vllm-gaudi)."""
    lib = torch.library.Library("hpu_emulation_test", "FRAGMENT")
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "HPU")
    out = torch.ops.hpu_emulation_test.double(torch.arange(3.0, device="hpu"))
    assert out.device.type == "hpu" and out.cpu().tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(NotImplementedError):
        torch.ops.hpu_emulation_test.double(torch.arange(3.0))  # a host tensor has no kernel


def test_a_card_generator_seeds_sampling_on_the_card_reproducibly():
    """vllm-gaudi's runner makes ``torch.Generator(device=self.device)`` per seeded request; a CPU
    build has no HPU generator, so the emulation gives a CPU one (draws are the CPU generator's)."""
    draws = []
    for _ in range(2):
        g = torch.Generator(device="hpu")
        g.manual_seed(1234)
        q = torch.empty(6, device="hpu")
        q.exponential_(generator=g)
        u = torch.empty(4, device="hpu").uniform_(generator=g)
        assert q.device.type == "hpu" and u.device.type == "hpu"
        draws.append(torch.cat([q.cpu(), u.cpu()]))
    assert torch.equal(draws[0], draws[1])
    other = torch.Generator(device="hpu").manual_seed(99)
    assert not torch.equal(torch.empty(6, device="hpu").exponential_(generator=other).cpu(), draws[0][:6])
    reference = torch.Generator().manual_seed(1234)  # the same stream as torch's own CPU generator
    assert torch.equal(draws[0][:6], torch.empty(6).exponential_(generator=reference))
    # every generator is still a torch.Generator, the default ones made in C++ included
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    assert torch.Generator("cpu").device == torch.device("cpu") and torch.Generator().device.type == "cpu"


def test_to_with_copy_keyword_on_host_and_card_tensors():
    """Tensor.to(copy=True, ...) (transformers' generate uses it) works with the device mode on."""
    host = torch.arange(4.0)
    same = host.to(copy=True, dtype=torch.float32, device="cpu")
    assert torch.equal(same, host) and same.data_ptr() != host.data_ptr()
    card = host.to("hpu")
    again = card.to(copy=True, device="hpu")
    assert again.device.type == "hpu" and again is not card and torch.equal(again.cpu(), host)
