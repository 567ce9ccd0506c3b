"""The op trace of a step: every op a forward runs, seen by a ``TorchDispatchMode`` on meta (or fake)
tensors, with its cost (:mod:`.ops`), the graph segment it falls in, the module that ran it, and
the tensors it read and wrote (for the fusion pass of :mod:`.roofline`); collectives and graph
boundaries are recorded by the code under trace through :meth:`OpTrace.collective` and
:meth:`OpTrace.mark_step`.

Live memory is followed too: each non-aliasing output counts from its creation until the last
reference to it goes, so :attr:`OpTrace.peak_bytes` is the peak of the eager op sequence (what
the card holds at once when nothing is fused away) on top of what existed before the trace.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from .ops import AT_REST_ITEMSIZE, LINK, NONE, OpCost, is_inplace, is_view, op_cost, tensors_in, touched_bytes

_ROOT = "_cost_root"  # attribute on a traced tensor: the id of the storage it views
#: storage ids, unique across traces (a parameter keeps the id an earlier trace gave it)
_IDS = itertools.count(1)


@dataclass
class OpRecord:
    name: str  # "aten.mm.default", "hpu.mixture_of_experts.fp8_fused_weights", "all_reduce"
    cost: OpCost
    segment: int
    module: str  # qualified name of the innermost module running (the workload names its class)
    inputs: tuple[int, ...]  # storage ids read
    outputs: tuple[int, ...]  # storage ids written
    out_bytes: dict[int, int] = field(default_factory=dict)  # bytes written per output storage
    in_bytes: dict[int, int] = field(default_factory=dict)  # bytes read per input storage
    collective_bytes: int = 0  # bytes a collective moves (0 for ops)
    ranks: int = 0  # the collective's group size (0 for ops)

    @property
    def kernel(self) -> bool:
        return self.cost.engine != NONE


class OpTrace(TorchDispatchMode):
    """Record the ops of a forward. Use as a context manager around the forward; call
    :meth:`mark_step` where the runner ends a graph and :meth:`collective` where it communicates.

    ``root``: a module whose ``named_modules`` name the ops' modules (hooks follow the forward)."""

    def __init__(self, root: nn.Module | None = None):
        super().__init__()
        self.records: list[OpRecord] = []
        self.segment = 0
        self._names = {id(m): n for n, m in root.named_modules()} if root is not None else {}
        self._stack: list[str] = []
        self._hooks: list = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self._labels: list[str] = []

    # ---- graph segments and collectives
    def mark_step(self) -> None:
        """The runner ends a graph here (``htcore.mark_step``); an empty segment is not counted."""
        if any(r.segment == self.segment for r in self.records):
            self.segment += 1

    @property
    def segments(self) -> int:
        return len({r.segment for r in self.records})

    def collective(self, kind: str, t: torch.Tensor, ranks: int) -> None:
        """A collective over ``ranks`` cards on ``t`` (the local tensor): all_reduce or all_gather."""
        cost = OpCost(LINK, "bf16", 0.0, 0.0, 0.0)
        nbytes = t.numel() * t.element_size()
        self.records.append(
            OpRecord(kind, cost, self.segment, self._module(), (), (), collective_bytes=nbytes, ranks=ranks)
        )

    @contextlib.contextmanager
    def label(self, name: str) -> Iterator[None]:
        """Tag the ops inside with ``name`` (a pseudo-module, e.g. a stood-in kernel)."""
        self._labels.append(name)
        try:
            yield
        finally:
            self._labels.pop()

    # ---- module names
    def _module(self) -> str:
        if self._labels:
            return (self._stack[-1] + "." if self._stack else "") + self._labels[-1]
        return self._stack[-1] if self._stack else ""

    def _pre(self, module, _inputs):
        self._stack.append(self._names.get(id(module), type(module).__name__))

    def _post(self, _module, _inputs, _output):
        if self._stack:
            self._stack.pop()

    def __enter__(self):
        if self._names:
            self._hooks = [
                nn.modules.module.register_module_forward_pre_hook(self._pre),
                nn.modules.module.register_module_forward_hook(self._post),
            ]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        return super().__exit__(*exc)

    # ---- storages
    def _root(self, t: torch.Tensor) -> int:
        root = getattr(t, _ROOT, None)
        if root is None:
            root = next(_IDS)
            try:
                setattr(t, _ROOT, root)
            except (AttributeError, RuntimeError):
                pass
        return root

    def _born(self, t: torch.Tensor, nbytes: int) -> None:
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(t, self._died, nbytes)

    def _died(self, nbytes: int) -> None:
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = tensors_in(args) + tensors_in(kwargs)
        outs = tensors_in(out)
        in_ids = tuple(self._root(t) for t in ins)
        cost = op_cost(func, args, kwargs, out)
        if is_view(func) or is_inplace(func):
            base = in_ids[0] if in_ids else next(_IDS)
            narrow = getattr(ins[0], AT_REST_ITEMSIZE, None) if ins else None
            for t in outs:
                if getattr(t, _ROOT, None) is None:
                    setattr(t, _ROOT, base)
                if narrow and is_view(func):
                    setattr(t, AT_REST_ITEMSIZE, narrow)
            out_ids = tuple(getattr(t, _ROOT) for t in outs)
            out_bytes = {i: int(cost.written) for i in out_ids[:1]} if cost.written else {}
        else:
            out_ids = tuple(self._root(t) for t in outs)
            out_bytes = {}
            for t, i in zip(outs, out_ids, strict=True):
                nbytes = t.numel() * t.element_size()
                out_bytes[i] = nbytes
                self._born(t, nbytes)
        in_bytes: dict[int, int] = {}
        for t, i in zip(ins, in_ids, strict=True):
            in_bytes[i] = in_bytes.get(i, 0) + touched_bytes(t)
        self.records.append(
            OpRecord(str(func), cost, self.segment, self._module(), in_ids, out_ids, out_bytes, in_bytes)
        )
        return out


def host_ops(records: list[OpRecord]) -> int:
    """Ops the host records in lazy mode: every dispatched op (views included), no collectives."""
    return sum(1 for r in records if r.cost.engine != LINK)
