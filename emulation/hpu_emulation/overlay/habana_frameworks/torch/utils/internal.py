"""``habana_frameworks.torch.utils.internal``."""

from hpu_emulation import config


def is_lazy() -> bool:
    """Lazy mode unless ``PT_HPU_LAZY_MODE=0``, as the bridge reads it."""
    return config.is_lazy()
