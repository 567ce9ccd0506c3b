"""A step's predicted time on a card, from its op trace: a roofline per kernel plus host time.

**Kernels.** The graph compiler fuses chains of pointwise ops: a tensor made by a pointwise op and
read only by pointwise ops of the same graph segment never reaches HBM, and its producer and
readers run as one kernel. Every other op is a kernel of its own; views and metadata ops are none.

**A kernel's time** is the largest of: its MME FLOPs over the MME peak at its dtype, its vector
FLOPs over the TPC peak, its HBM bytes over the HBM bandwidth (the three divided by the achieved
fraction of peak, one calibration constant), and the kernel floor (no kernel takes less).

**A graph segment's device time** is the larger of its work (every kernel's roofline time without
the floor, and the collectives, one after another: kernels share the card's throughput) and its
span (the longest chain of kernels that read what another wrote, each at least the floor, the
collectives as barriers): small independent kernels overlap, a dependent chain of them pays the
floor each.

**Collectives** (tensor-parallel all-reduce and all-gather over the scale-up links, all-to-all
within the box): an all-reduce of S bytes over n cards moves 2 (n-1)/n S through each card's
links (reduce-scatter, then all-gather), an all-gather (n-1) S of the local S; plus a fixed latency
each. Collectives are serial with the kernels around them.

**Host time**, two modes:

* ``replay`` (a decode step whose graphs were captured: vllm-gaudi's HPU graphs): the host
  launches each graph and the runner does its per-step work; neither overlaps the device (the
  step waits for its tokens). Step = step host + graphs x launch + device time.
* ``lazy`` (a step the bridge records op by op: a prefill chunk above the graph capture size):
  the host records a segment's ops while the card runs the previous segment; a segment starts
  when both its recording and the previous segment's execution are done. Step = step host +
  recording of the first segment + sum over the rest of max(recording, previous execution) +
  the last segment's execution.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from .hardware import GAUDI2, Calibration, Card
from .ops import LINK, MME, NONE, TPC
from .trace import OpRecord

REPLAY, LAZY = "replay", "lazy"


@dataclass
class Kernel:
    ops: list[int]
    segment: int
    module: str
    engine: str
    mme_flops: float = 0.0
    vector_flops: float = 0.0
    bytes: float = 0.0
    family: str = "bf16"
    time: float = 0.0  # the roofline time, at least the floor
    roof: float = 0.0  # the roofline time without the floor (the kernel's share of the card's throughput)
    bound: str = ""  # "compute", "memory" or "floor"
    reads: set[int] = field(default_factory=set)  # storages it reads from other kernels or the step's inputs
    writes: set[int] = field(default_factory=set)


def _internal(records: list[OpRecord]) -> set[int]:
    """Storages fused away: one pointwise producer, read only by pointwise ops of its segment."""
    producers: dict[int, list[int]] = defaultdict(list)
    consumers: dict[int, list[int]] = defaultdict(list)
    for j, r in enumerate(records):
        if r.cost.engine in (NONE, LINK):
            continue
        for i in r.out_bytes:
            producers[i].append(j)
        for i in r.inputs:
            if i not in r.out_bytes:
                consumers[i].append(j)
    internal = set()
    for i, prods in producers.items():
        if len(prods) != 1 or not consumers.get(i):
            continue
        p = records[prods[0]]
        if p.cost.fusible and all(records[c].cost.fusible and records[c].segment == p.segment for c in consumers[i]):
            internal.add(i)
    return internal


def kernels(records: list[OpRecord], card: Card = GAUDI2, cal: Calibration | None = None) -> list[Kernel]:
    """The trace's kernels after pointwise fusion, each with its roofline time."""
    cal = cal or Calibration()
    internal = _internal(records)
    parent = list(range(len(records)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    producer = {}
    for j, r in enumerate(records):
        if r.cost.engine in (NONE, LINK):
            continue
        for i in r.inputs:
            if i in internal and i in producer:
                parent[find(j)] = find(producer[i])
        for i in r.out_bytes:
            if i in internal:
                producer[i] = j
    groups: dict[int, Kernel] = {}
    for j, r in enumerate(records):
        if r.cost.engine in (NONE, LINK):
            continue
        k = groups.get(find(j))
        if k is None:
            k = groups[find(j)] = Kernel([], r.segment, r.module, r.cost.engine, family=r.cost.family)
        k.ops.append(j)
        k.reads.update(i for i in r.inputs if i not in internal and i not in k.writes)
        k.writes.update(i for i in r.out_bytes if i not in internal)
        moved = sum(b for i, b in r.in_bytes.items() if i in internal) + sum(
            b for i, b in r.out_bytes.items() if i in internal
        )
        k.bytes += max(0.0, r.cost.read + r.cost.written - moved)
        if r.cost.engine == MME:
            k.engine, k.family = MME, r.cost.family
            k.mme_flops += r.cost.flops
            k.vector_flops += r.cost.vector_flops
        else:
            k.vector_flops += r.cost.flops
            if r.cost.family == "fp32":
                k.family = "fp32" if k.engine == TPC else k.family
    out = sorted(groups.values(), key=lambda k: k.ops[0])
    for k in out:
        vector_family = "fp32" if (k.family == "fp32" and k.engine == TPC) else "bf16"
        eff = cal.efficiency.value
        times = {
            "compute": max(
                k.mme_flops / card.mme_peak(k.family) if k.mme_flops else 0.0,
                k.vector_flops / card.tpc_peak(vector_family) if k.vector_flops else 0.0,
            )
            / eff,
            "memory": k.bytes / card.hbm_bandwidth.value / eff,
            "floor": cal.kernel_floor.value,
        }
        k.bound = max(times, key=times.__getitem__)
        k.time = times[k.bound]
        k.roof = max(times["compute"], times["memory"])
    return out


def collective_time(r: OpRecord, card: Card, cal: Calibration) -> float:
    n = max(r.ranks, 1)
    if n == 1:
        return 0.0
    moved = 2 * (n - 1) / n * r.collective_bytes if r.name == "all_reduce" else (n - 1) * r.collective_bytes
    return cal.collective_latency.value + moved / card.scale_up_bandwidth.value


def _device_time(ks: list[Kernel], records: list[OpRecord], card: Card, cal: Calibration) -> dict[int, float]:
    """Each segment's device time: the larger of its work (the kernels' roofline times and the
    collectives, one after another) and its span (the longest chain of dependent kernels, each at
    least the floor, with the collectives as barriers). Independent small kernels overlap (the
    graph compiler runs them on free TPCs and engines); a chain of them pays the floor each."""
    events: list[tuple[int, int, object]] = [(k.ops[0], 0, k) for k in ks]
    events += [(j, 1, r) for j, r in enumerate(records) if r.cost.engine == LINK]
    events.sort(key=lambda e: (e[0], e[1]))
    work: dict[int, float] = defaultdict(float)
    span: dict[int, float] = defaultdict(float)
    ready: dict[int, float] = {}
    barrier, segment = 0.0, None
    for _, kind, item in events:
        seg = item.segment  # type: ignore[union-attr]
        if seg != segment:  # a new graph starts when the previous one is done
            segment, ready, barrier = seg, {}, 0.0
        if kind == 1:
            t = collective_time(item, card, cal)  # type: ignore[arg-type]
            barrier = max([barrier, *ready.values()]) + t
            work[seg] += t
            span[seg] = max(span[seg], barrier)
            continue
        k = item
        start = max([barrier, *(ready.get(i, 0.0) for i in k.reads)])  # type: ignore[union-attr]
        finish = start + k.time  # type: ignore[union-attr]
        for i in k.writes:  # type: ignore[union-attr]
            ready[i] = finish
        work[seg] += k.roof  # type: ignore[union-attr]
        span[seg] = max(span[seg], finish)
    return {s: max(work[s], span[s]) for s in set(work) | set(span)}


@dataclass
class StepTime:
    """A step's predicted time (seconds) and what it is made of. PREDICTION, not a measurement."""

    mode: str
    card: str
    total: float
    device: float
    host: float
    collectives: float
    kernels: int
    host_ops: int
    segments: int
    by_class: dict[str, float] = field(default_factory=dict)  # device time by op class
    by_bound: dict[str, float] = field(default_factory=dict)  # kernel time by what bounds it
    workspace_peak: int = 0  # bytes of live tensors at the step's peak (eager), set by the tracer's owner

    def dominant(self, n: int = 4) -> list[tuple[str, float]]:
        return sorted(self.by_class.items(), key=lambda kv: -kv[1])[:n]


def predict(
    records: list[OpRecord],
    mode: str,
    card: Card = GAUDI2,
    cal: Calibration | None = None,
    classify: Callable[[str], str] = lambda module: module or "other",
) -> StepTime:
    """The step's time on ``card``: kernels by roofline, collectives, host time by ``mode``
    (``replay`` or ``lazy``). ``classify`` maps a record's module name to its op class."""
    cal = cal or Calibration()
    ks = kernels(records, card, cal)
    seg_device = _device_time(ks, records, card, cal)
    seg_ops: dict[int, int] = defaultdict(int)
    by_class: dict[str, float] = defaultdict(float)
    by_bound: dict[str, float] = defaultdict(float)
    for k in ks:
        by_class[classify(k.module)] += k.time
        by_bound[k.bound] += k.time
    coll = 0.0
    for r in records:
        if r.cost.engine == LINK:
            coll += collective_time(r, card, cal)
        else:
            seg_ops[r.segment] += 1
    # the classes share the device time in proportion to their kernels' times
    kernel_sum = sum(by_class.values())
    scale = (sum(seg_device.values()) - coll) / kernel_sum if kernel_sum else 0.0
    by_class = defaultdict(float, {c: t * scale for c, t in by_class.items()})
    by_class["collectives"] = coll
    segments = sorted(set(seg_device) | set(seg_ops))
    device = sum(seg_device.values())
    n_ops = sum(seg_ops.values())
    if mode == REPLAY:
        host = cal.step_host.value + len(segments) * cal.graph_launch.value
        total = host + device
    elif mode == LAZY:
        rec = [seg_ops[s] * cal.host_op.value + cal.graph_launch.value for s in segments]
        dev = [seg_device[s] for s in segments]
        total = cal.step_host.value + rec[0]
        for s in range(1, len(segments)):
            total += max(rec[s], dev[s - 1])
        total += dev[-1]
        host = cal.step_host.value + sum(rec)
    else:
        raise ValueError(f"mode {mode!r}: expected {REPLAY!r} or {LAZY!r}")
    return StepTime(
        mode, card.name, total, device, host, coll, len(ks), n_ops, len(segments), dict(by_class), dict(by_bound)
    )
