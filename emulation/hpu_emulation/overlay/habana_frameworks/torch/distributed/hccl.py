"""``habana_frameworks.torch.distributed.hccl``: importing it makes the ``hccl`` backend available.

On the emulation HCCL is gloo: the collectives' meaning, none of their speed or topology."""

from hpu_emulation.distributed import register_hccl

register_hccl()
