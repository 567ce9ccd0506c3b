"""The cost model's arithmetic (``hpu_emulation.cost``): op costs, fusion, the roofline's bound,
collectives, host time, and a tiny model traced on meta tensors. PREDICTIONS, checked against
hand arithmetic, not against a card."""

import math

import pytest
import torch
import torch.nn as nn

from hpu_emulation.cost import GAUDI2, GAUDI3, LAZY, REPLAY, Calibration, OpTrace, kernels, predict
from hpu_emulation.cost.ops import MME, busiest_card_hits


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _cal(**values) -> Calibration:
    cal = Calibration()
    for name, value in values.items():
        c = getattr(cal, name)
        cal = type(cal)(**{**cal.__dict__, name: type(c)(value, c.unit, c.fitted_on, c.why)})
    return cal


def test_matmul_flops_and_bytes_are_exact():
    m, k, n = 64, 128, 32
    a, b = _meta(m, k), _meta(k, n)
    with OpTrace() as t:
        _ = a @ b
    (r,) = t.records
    assert r.name == "aten.mm.default"
    assert r.cost.engine == MME and r.cost.family == "bf16"
    assert r.cost.flops == 2 * m * k * n
    assert r.cost.read == (m * k + k * n) * 2
    assert r.cost.written == m * n * 2


def test_batched_and_fp8_matmul_rates():
    a, b = _meta(4, 8, 16), _meta(4, 16, 2)
    x, w = _meta(8, 16, dtype=torch.float8_e4m3fn), _meta(16, 8, dtype=torch.float8_e4m3fn)
    with OpTrace() as t:
        torch.bmm(a, b)
        torch.mm(x, w)
    bmm, fp8 = t.records
    assert bmm.cost.flops == 2 * 4 * 8 * 16 * 2
    assert fp8.cost.family == "fp8" and bmm.cost.family == "bf16"


def test_a_broadcast_input_is_read_once():
    x, y = _meta(1, 4096).expand(1024, 4096), _meta(1024, 4096)
    with OpTrace() as t:
        _ = x + y
    assert t.records[0].cost.read == 4096 * 2 + 1024 * 4096 * 2


def test_views_are_no_kernel_and_cost_nothing():
    x = _meta(8, 8).contiguous()
    with OpTrace() as t:
        x.view(64).unsqueeze(0).t()
    assert t.records and all(r.cost.engine == "none" and r.cost.read == 0 for r in t.records)
    assert kernels(t.records) == []


def test_roofline_picks_the_bound():
    cal = _cal(efficiency=1.0, kernel_floor=1e-6)
    a, b, v, s = _meta(8192, 8192), _meta(8192, 8192), _meta(1, 8192), _meta(4, 4)
    with OpTrace() as t:
        a @ b  # 1.1 TFLOP on 0.4 GB: compute-bound
    (k,) = kernels(t.records, GAUDI2, cal)
    assert k.bound == "compute"
    assert k.time == pytest.approx(2 * 8192**3 / GAUDI2.mme_peak("bf16"))
    with OpTrace() as t:
        v @ b  # a GEMV: 134 MB for 0.13 GFLOP: memory-bound
    (k,) = kernels(t.records, GAUDI2, cal)
    assert k.bound == "memory"
    assert k.time == pytest.approx((8192 + 8192 * 8192 + 8192) * 2 / GAUDI2.hbm_bandwidth.value)
    with OpTrace() as t:
        s + 1  # tiny: the kernel floor
    (k,) = kernels(t.records, GAUDI2, cal)
    assert k.bound == "floor" and k.time == 1e-6


def test_efficiency_scales_compute_and_memory_not_the_floor():
    v, w = _meta(1, 8192), _meta(8192, 8192)
    with OpTrace() as t:
        v @ w
    full = kernels(t.records, GAUDI2, _cal(efficiency=1.0))[0].time
    half = kernels(t.records, GAUDI2, _cal(efficiency=0.5))[0].time
    assert half == pytest.approx(2 * full)


def test_gaudi3_is_faster_than_gaudi2_on_the_same_trace():
    a, v, w = _meta(4096, 4096), _meta(1, 8192), _meta(8192, 8192)
    with OpTrace() as t:
        a @ a
        v @ w
    g2 = predict(t.records, REPLAY, GAUDI2).device
    g3 = predict(t.records, REPLAY, GAUDI3).device
    assert 0 < g3 < g2


def test_a_pointwise_chain_is_one_kernel_without_its_intermediates():
    x = _meta(1024, 1024)
    with OpTrace() as t:
        y = (torch.relu(x).float() * 2).sum()
    ks = kernels(t.records)
    assert [len(k.ops) for k in ks] == [3, 1]  # relu + cast + mul fused; the reduction apart
    fused = ks[0]
    # reads x (bf16), writes the product (fp32) for the sum; the relu and cast outputs never reach HBM
    assert fused.bytes == 1024 * 1024 * 2 + 1024 * 1024 * 4
    del y


def test_a_tensor_read_by_a_matmul_is_not_fused_away():
    x, w = _meta(64, 64), _meta(64, 64)
    with OpTrace() as t:
        torch.relu(x) @ w
    relu = kernels(t.records)[0]
    assert relu.bytes == 64 * 64 * 2 * 2  # read x, write the relu for the MME


def test_segments_follow_mark_step_and_lazy_host_time_overlaps():
    cal = _cal(host_op=10e-6, kernel_floor=1e-6, step_host=0.0, graph_launch=0.0, efficiency=1.0)
    x = _meta(4, 4)
    with OpTrace() as t:
        for _ in range(3):
            y = x
            for _ in range(10):
                y = y @ y  # a chain of MME kernels: each waits for the one before
            t.mark_step()
    assert t.segments == 3
    lazy = predict(t.records, LAZY, GAUDI2, cal)
    # 10 ops of 10 us recorded per segment while the previous one (10 kernels of 1 us) runs
    assert lazy.host_ops == 30
    assert lazy.total == pytest.approx(3 * 100e-6 + 10e-6)
    replay = predict(t.records, REPLAY, GAUDI2, cal)
    assert replay.total == pytest.approx(30e-6)


def test_independent_small_kernels_overlap_a_chain_does_not():
    cal = _cal(kernel_floor=1e-6, step_host=0.0, graph_launch=0.0)
    x = _meta(4, 4)
    with OpTrace() as t:
        for _ in range(10):
            x + 1  # ten kernels that read only x
    assert predict(t.records, REPLAY, GAUDI2, cal).device == pytest.approx(1e-6)
    with OpTrace() as t:
        y = x
        for _ in range(10):
            y = y.sum(0, keepdim=True) + y  # reductions between: not fused, each waits for the last
    assert predict(t.records, REPLAY, GAUDI2, cal).device == pytest.approx(10 * 2e-6)


def test_all_reduce_time_from_bytes_and_link_bandwidth():
    cal = _cal(collective_latency=5e-6, step_host=0.0, graph_launch=0.0)
    x = _meta(8192, 4096)
    with OpTrace() as t:
        t.collective("all_reduce", x, 8)
    st = predict(t.records, REPLAY, GAUDI2, cal)
    moved = 2 * 7 / 8 * 8192 * 4096 * 2
    assert st.collectives == pytest.approx(5e-6 + moved / GAUDI2.scale_up_bandwidth.value)
    assert st.by_class["collectives"] == st.collectives


def test_peak_follows_live_tensors():
    with OpTrace() as t:
        a = torch.empty(1024, 1024, device="meta")  # 4 MiB
        b = a * 2  # 8 MiB live
        del a, b
        c = torch.empty(256, device="meta")
        del c
    assert t.peak_bytes == 2 * 4 * 2**20
    assert t.live_bytes == 0


def test_expected_routing_on_the_busiest_card():
    hit, pairs = busiest_card_hits(1, 8, 288, 8)
    assert 1 <= hit <= 8 and hit == pairs  # one token: each hit expert has one pair
    hit, pairs = busiest_card_hits(8192, 8, 288, 8)
    assert hit == 36 and pairs >= 8192  # every local expert; at least the mean load
    assert busiest_card_hits(8192, 8, 288, 1)[1] == 8192 * 8


def test_a_tiny_model_on_meta_gives_a_step_with_positive_times():
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256), nn.LayerNorm(256))
    model = model.to(device="meta", dtype=torch.bfloat16)
    with torch.no_grad(), OpTrace(model) as t:
        h = torch.empty(32, 256, device="meta", dtype=torch.bfloat16)
        for _ in range(4):
            h = model(h)
            t.mark_step()
    for mode in (REPLAY, LAZY):
        for card in (GAUDI2, GAUDI3):
            st = predict(t.records, mode, card, classify=lambda m: m.split(".")[0] or "model")
            assert st.total > st.device > 0 and st.host > 0
            assert st.kernels > 0 and st.segments == 4
            assert math.isclose(sum(st.by_class.values()), st.device)
            assert set(st.by_class) <= {"0", "1", "2", "3", "model", "collectives"}


def test_every_card_figure_has_a_source():
    for card in (GAUDI2, GAUDI3):
        for name, value, source in card.sources():
            assert value > 0 and source, name
    assert GAUDI2.hbm_bandwidth.value == 2.46e12 and GAUDI3.hbm_bandwidth.value == 3.67e12
    assert GAUDI2.hbm_bytes == 98_304 * 2**20
    for name, c in Calibration().rows():
        assert c.fitted_on or c.why, name
