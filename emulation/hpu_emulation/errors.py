"""The one error for what the emulation does not do."""


class NotEmulated(NotImplementedError, AttributeError):
    """A Habana API the emulation does not provide. A NotImplementedError naming it; also an
    AttributeError, so ``hasattr`` and ``getattr(..., default)`` feature probes see it as absent."""


def missing(module: str, name: str) -> NotEmulated:
    return NotEmulated(f"{module}.{name} is not emulated (hpu_emulation)")
