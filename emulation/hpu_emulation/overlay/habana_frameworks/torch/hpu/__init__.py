"""``habana_frameworks.torch.hpu``, registered as ``torch.hpu``: the device module.

One card (index 0), synchronous: ops run when called, so ``synchronize`` and stream waits have
nothing to wait for. ``mem_get_info`` reports the declared card (``HPU_EMULATION_DEVICE``,
``HPU_EMULATION_MEMORY``) minus what the emulation counted as allocated.
"""

import contextlib

import torch

from habana_frameworks.torch.hpu import graphs, metrics, random  # noqa: F401
from habana_frameworks.torch.hpu.graphs import wrap_in_hpu_graph  # noqa: F401
from habana_frameworks.torch.hpu.random import manual_seed, manual_seed_all  # noqa: F401
from hpu_emulation import config, memory
from hpu_emulation.errors import missing


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    return None


def init() -> None:
    return None


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    index = torch.device(device).index if not isinstance(device, int) else device
    if index not in (None, 0):
        raise RuntimeError(f"hpu emulation: one card per process, index 0 (asked for {device!r})")


def get_device_name(device=None) -> str:
    return "GAUDI2" if config.card().name == "gaudi2" else "GAUDI3"


def get_device_capability(device=None):
    return None


def synchronize(device=None) -> None:
    """Ops ran when they were called: nothing is pending."""


def mem_get_info(device=None) -> tuple[int, int]:
    return memory.mem_get_info()


def memory_allocated(device=None) -> int:
    return memory.allocated()


def max_memory_allocated(device=None) -> int:
    return memory.stats()["peak"]


def reset_peak_memory_stats(device=None) -> None:
    memory.reset_peak()


def memory_stats(device=None) -> dict:
    stats = memory.stats()
    free, total = memory.mem_get_info()
    return {
        "InUse": stats["allocated"],
        "MaxInUse": stats["peak"],
        "Limit": total,
        "NumAllocs": stats["allocations"],
    }


def empty_cache() -> None:
    """Freed storages return to the emulated card at once."""


class Event:
    """A completed event: the emulation has no pending work."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None:
        return None

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event) -> float:
        raise NotImplementedError("hpu emulation: Event timing is not emulated (no device clock)")


class Stream:
    """A stream whose work is always complete (ops run synchronously)."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = torch.device("hpu", 0)
        self.priority = priority

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_default_stream = Stream()


def current_stream(device=None) -> Stream:
    return _default_stream


def default_stream(device=None) -> Stream:
    return _default_stream


@contextlib.contextmanager
def stream(s=None):
    yield


def get_rng_state(device=None):
    return torch.get_rng_state()


def set_rng_state(state, device=None) -> None:
    torch.set_rng_state(state)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing("torch.hpu", name)
