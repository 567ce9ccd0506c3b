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
    _compile_hpu_backend_as_eager()


def _compile_hpu_backend_as_eager() -> None:
    """``torch.compile(fn, backend="hpu_backend")`` gives ``fn`` itself.

    Dynamo cannot trace the card tensors (a Python subclass whose ``__torch_function__`` runs the
    call on the host: ``UserDefinedObjectVariable(HPUTensor)``), so a function compiled for the
    card would fail on its first call. The eager backend runs the same code, so the function is
    returned unchanged. Reached, e.g., by ``get_masked_input_and_mask`` (vocab-parallel embedding
    at TP > 1) and the grouped top-k router, both compiled with the platform's
    ``simple_compile_backend``. Other backends are torch's own ``torch.compile``.
    """
    if getattr(torch.compile, "__hpu_emulation__", False):
        return
    original = torch.compile

    def compile(model=None, *args, **kwargs):
        if kwargs.get("backend") != "hpu_backend":
            return original(model, *args, **kwargs) if model is not None else original(*args, **kwargs)
        if model is None:  # used as @torch.compile(backend="hpu_backend", ...)
            return lambda fn: fn
        return model

    compile.__hpu_emulation__ = True  # type: ignore[attr-defined]
    compile.__wrapped__ = original  # type: ignore[attr-defined]
    torch.compile = compile  # type: ignore[assignment]


__all__ = ["register_hccl", "register_hpu_backend", "torch"]
