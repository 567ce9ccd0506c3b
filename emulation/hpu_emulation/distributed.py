"""HCCL as gloo, and ``hpu_backend`` for ``torch.compile`` as eager.

``hccl`` is registered as a process-group backend that builds a gloo group, for both ``cpu`` and
``hpu`` tensors; card tensors reach gloo unwrapped (``device.HPUTensor`` hands collectives their
CPU data). Collectives keep their meaning; nothing of HCCL's topology, speed or failure modes.
"""

from __future__ import annotations

import torch


def _make_gloo(*args, **kwargs):
    # The creator gets a c10d.Backend.Options-like object in newer torch (store, rank, size, timeout).
    from torch.distributed import ProcessGroupGloo

    if len(args) == 1 and hasattr(args[0], "store"):  # torch's extended creator API
        opts = args[0]
        return ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    store, rank, size, timeout = args[:4]
    return ProcessGroupGloo(store, rank, size, timeout)


def register_hccl() -> None:
    import torch.distributed as dist

    if not dist.is_available() or "hccl" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("hccl", _make_gloo, devices=["cpu", "hpu"])


def _eager(gm, example_inputs, **kwargs):
    return gm.forward


def register_hpu_backend() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "hpu_backend" not in _COMPILER_FNS:
        register_backend(compiler_fn=_eager, name="hpu_backend")


__all__ = ["register_hccl", "register_hpu_backend", "torch"]
