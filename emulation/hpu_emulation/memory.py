"""Card memory, accounted: every allocation on the emulated ``hpu`` device, by purpose, with the peak,
against the declared card (``config.card()``). An allocation past the card fails as on a card: out
of memory, with the breakdown.

An allocation is a storage: views share their base's storage and are counted once; a storage is
released when the last card tensor that holds it is collected. What this cannot show: the card
runtime's own reservations, fragmentation, and graph memory (see the README).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from hpu_emulation import config

PURPOSES = ("weights", "kv_cache", "workspace")
_local = threading.local()
_lock = threading.Lock()


@dataclass
class _Storage:
    nbytes: int
    purpose: str
    holders: int = 0


@dataclass
class Ledger:
    live: dict[int, _Storage] = field(default_factory=dict)
    by_purpose: Counter = field(default_factory=Counter)
    peak_by_purpose: Counter = field(default_factory=Counter)
    allocated: int = 0
    peak: int = 0
    allocations: int = 0


_ledger = Ledger()
# Storages whose last card tensor was collected, not yet taken off the ledger. A tensor's finalizer
# can run inside any allocation (a garbage collection starts there, under ``_lock``), so it only
# queues the address; whoever holds the lock next takes it off.
_released: deque[int] = deque()


class CardOutOfMemory(torch.OutOfMemoryError):
    """The declared card cannot hold this allocation."""


def current_purpose() -> str:
    stack = getattr(_local, "purpose", None)
    return stack[-1] if stack else "workspace"


@contextlib.contextmanager
def purpose(name: str) -> Iterator[None]:
    """Allocations made inside are counted as ``name`` (weights, kv_cache, workspace)."""
    if name not in PURPOSES:
        raise ValueError(f"memory purpose {name!r}: expected one of {PURPOSES}")
    stack = getattr(_local, "purpose", None)
    if stack is None:
        stack = _local.purpose = []
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def _gib(n: int) -> str:
    return f"{n / config.GIB:.3f} GiB"


def _drain() -> None:
    """Take released storages off the ledger; the caller holds ``_lock``."""
    while _released:
        ptr = _released.popleft()
        entry = _ledger.live.get(ptr)
        if entry is None:
            continue
        entry.holders -= 1
        if entry.holders <= 0:
            del _ledger.live[ptr]
            _ledger.allocated -= entry.nbytes
            _ledger.by_purpose[entry.purpose] -= entry.nbytes


@contextlib.contextmanager
def _ledger_locked() -> Iterator[Ledger]:
    with _lock:
        _drain()
        yield _ledger


def breakdown() -> str:
    with _ledger_locked():
        return _breakdown()


def _breakdown() -> str:
    card = config.card()
    parts = ", ".join(f"{p} {_gib(_ledger.by_purpose[p])}" for p in PURPOSES)
    return f"{card.name} card {_gib(card.memory)}: allocated {_gib(_ledger.allocated)} ({parts}); peak {_gib(_ledger.peak)}"


def _acquire(ptr: int, nbytes: int) -> None:
    limit = config.card().memory
    with _ledger_locked():
        entry = _ledger.live.get(ptr)
        if entry is None:
            if _ledger.allocated + nbytes > limit:
                raise CardOutOfMemory(
                    f"hpu emulation: out of card memory allocating {_gib(nbytes)} for "
                    f"{current_purpose()}: {_breakdown()}"
                )
            entry = _ledger.live[ptr] = _Storage(nbytes, current_purpose())
            _ledger.allocated += nbytes
            _ledger.by_purpose[entry.purpose] += nbytes
            _ledger.allocations += 1
            if _ledger.allocated > _ledger.peak:
                _ledger.peak = _ledger.allocated
            if _ledger.by_purpose[entry.purpose] > _ledger.peak_by_purpose[entry.purpose]:
                _ledger.peak_by_purpose[entry.purpose] = _ledger.by_purpose[entry.purpose]
        entry.holders += 1


def _release(cell: list[int]) -> None:
    ptr = cell[0]
    if not ptr:
        return
    cell[0] = 0
    _released.append(ptr)
    # Never wait here: this thread may already hold the lock (a finalizer inside ``_acquire``).
    if _lock.acquire(blocking=False):
        try:
            _drain()
        finally:
            _lock.release()


# id(card tensor) -> [storage address it holds]; not a WeakKeyDictionary, whose lookups would
# compare tensors with ==.
_cells: dict[int, list[int]] = {}


def _forget(key: int, cell: list[int]) -> None:
    _release(cell)
    _cells.pop(key, None)


def track(wrapper: torch.Tensor, elem: torch.Tensor) -> None:
    """Count ``elem``'s storage as held by the card tensor ``wrapper`` (again after ``.data = ...``)."""
    storage = elem.untyped_storage()
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    cell = _cells.get(id(wrapper))
    if cell is not None:
        if cell[0] == ptr:
            return
        _release(cell)
    if not ptr or not nbytes:
        return
    _acquire(ptr, nbytes)
    if cell is None:
        cell = [ptr]
        _cells[id(wrapper)] = cell
        weakref.finalize(wrapper, _forget, id(wrapper), cell)
    else:
        cell[0] = ptr


def allocated() -> int:
    with _ledger_locked() as ledger:
        return ledger.allocated


def mem_get_info() -> tuple[int, int]:
    total = config.card().memory
    return max(total - allocated(), 0), total


def stats() -> dict[str, int]:
    with _ledger_locked() as ledger:
        out = {"allocated": ledger.allocated, "peak": ledger.peak, "allocations": ledger.allocations}
        for p in PURPOSES:
            out[p] = ledger.by_purpose[p]
            out[f"peak_{p}"] = ledger.peak_by_purpose[p]
    return out


def reset_peak() -> None:
    with _ledger_locked():
        _ledger.peak = _ledger.allocated
        _ledger.peak_by_purpose = Counter(_ledger.by_purpose)
