"""What would break an HPU graph, counted.

In lazy mode the card records ops on the host and runs them at ``mark_step``; what the runner
wraps with ``wrap_in_hpu_graph`` is captured once per input shape and replayed. A host
synchronisation inside such a region (a value read back, an output whose shape depends on the
data) cannot be captured: on a card it breaks the graph or replays a stale value. The emulation
runs everything eagerly, so it counts instead: per step, the ``mark_step`` calls, the aten ops
between them (one segment per mark: per decoder layer where the runner marks after each layer),
every host synchronisation with the file:line that caused it, and whether it fell inside a
captured region. ``HPU_EMULATION_STRICT_SYNC=1`` (or :func:`strict`) raises on a host
synchronisation inside a captured region.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

STRICT_ENV = "HPU_EMULATION_STRICT_SYNC"
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(__import__("torch").__file__))


class HostSyncInGraph(RuntimeError):
    """A host synchronisation inside a region the card would capture as an HPU graph."""


@dataclass
class Sync:
    reason: str
    where: str
    in_graph: bool


@dataclass
class Step:
    label: str
    marks: int = 0
    ops: Counter = field(default_factory=Counter)
    segments: list[int] = field(default_factory=lambda: [0])
    syncs: list[Sync] = field(default_factory=list)
    graph_calls: int = 0

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())

    @property
    def syncs_in_graph(self) -> list[Sync]:
        return [s for s in self.syncs if s.in_graph]

    def summary(self) -> str:
        where = Counter((s.reason, s.where) for s in self.syncs_in_graph)
        lines = [
            f"{self.label}: {self.marks} mark_step, {self.op_count} ops, {len(self.syncs)} host syncs "
            f"({len(self.syncs_in_graph)} inside captured regions), {self.graph_calls} graph calls"
        ]
        lines += [f"  sync in graph x{n}: {reason} at {loc}" for (reason, loc), n in where.most_common()]
        return "\n".join(lines)


class _State(threading.local):
    def __init__(self) -> None:
        self.graph_depth = 0
        self.step: Step | None = None
        self.counting_ops = False


_state = _State()
_steps: list[Step] = []
_strict = [os.environ.get(STRICT_ENV, "0") not in ("", "0")]


def strict(on: bool = True) -> None:
    _strict[0] = on


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not (path.startswith(_HERE) or path.startswith(_TORCH) or path.startswith("<")):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def host_sync(reason: str) -> None:
    in_graph = _state.graph_depth > 0
    step = _state.step
    if step is None and not in_graph:
        return
    where = _caller()
    if step is not None:
        step.syncs.append(Sync(reason, where, in_graph))
    if in_graph and _strict[0]:
        raise HostSyncInGraph(f"host synchronisation ({reason}) inside a captured HPU graph region at {where}")


def mark_step() -> None:
    step = _state.step
    if step is not None:
        step.marks += 1
        step.segments.append(0)


class _OpCounter(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        step = _state.step
        if step is not None:
            step.ops[str(func.overloadpacket.__name__)] += 1
            step.segments[-1] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def ops_of(func: Any) -> Iterator[None]:
    """Count the aten ops that ``func`` runs on the card's data (only while a step is open)."""
    if _state.step is None or _state.counting_ops:
        yield
        return
    _state.counting_ops = True
    try:
        with _OpCounter():
            yield
    finally:
        _state.counting_ops = False


@contextlib.contextmanager
def graph_region() -> Iterator[None]:
    """The body of a module the runner wrapped as an HPU graph, called without bypass."""
    _state.graph_depth += 1
    if _state.step is not None:
        _state.step.graph_calls += 1
    try:
        yield
    finally:
        _state.graph_depth -= 1


def in_graph() -> bool:
    return _state.graph_depth > 0


@contextlib.contextmanager
def step(label: str) -> Iterator[Step]:
    """Count one runner step (a prefill or a decode) under ``label``."""
    record = Step(label)
    outer, _state.step = _state.step, record
    try:
        yield record
    finally:
        _state.step = outer
        _steps.append(record)


def steps() -> list[Step]:
    return list(_steps)


def current_step() -> Step | None:
    """The step being counted now (its label says prefill, decode or warmup), None outside one."""
    return _state.step


def clear() -> None:
    _steps.clear()
