"""``habana_frameworks.torch.core``: lazy-mode step control."""

from hpu_emulation import counting
from hpu_emulation.errors import missing


def mark_step(sync: bool = False) -> None:
    """In lazy mode the card compiles and runs what was recorded since the last mark. Here every op
    already ran; the mark is counted (a segment boundary in the step report)."""
    counting.mark_step()


def hpu_initialize(*args, **kwargs) -> None:
    """Device bring-up; the emulated card needs none."""


def hpu_inference_set_env(*args, **kwargs) -> None:
    """Bridge settings for inference; nothing to set on the emulation."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing("habana_frameworks.torch.core", name)
