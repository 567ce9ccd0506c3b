"""``habana_frameworks.torch.hpex`` of the emulated bridge: fused kernels and normalization.

Module layout as Intel documents the package (https://docs.habana.ai/en/latest/PyTorch/Python_Packages.html:
``hpex`` with ``kernels``, ``normalization``, ``optimizers``; only the first two are emulated).
Importing it registers the emulated ``torch.ops.hpu`` kernels (``hpu_emulation.ops``).
"""

from hpu_emulation import ops as _ops

_ops.register()
