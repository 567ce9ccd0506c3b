"""``habana_frameworks.torch.hpex`` of the emulated bridge: fused kernels and normalization.

Importing it registers the emulated ``torch.ops.hpu`` kernels (``hpu_emulation.ops``).
"""

from hpu_emulation import ops as _ops

_ops.register()
