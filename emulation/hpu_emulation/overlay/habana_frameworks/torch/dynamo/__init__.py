"""``habana_frameworks.torch.dynamo``: the ``hpu_backend`` for ``torch.compile`` (eager here)."""

from hpu_emulation.distributed import register_hpu_backend

register_hpu_backend()
