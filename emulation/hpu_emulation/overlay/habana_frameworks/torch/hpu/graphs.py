"""``torch.hpu.graphs``: HPU graphs, counted rather than captured.

On a card ``wrap_in_hpu_graph`` captures the module's forward once per input signature and
replays it. Here the forward runs eagerly; each call that the runner does not bypass counts as a
graph call, its signature as a capture (first time) or a replay, and the body is a captured region
for the host-sync counter (``hpu_emulation.counting``).
"""

import functools

import torch

from hpu_emulation import counting
from hpu_emulation.config import is_lazy


def input_hash(obj) -> int:
    """The graph cache key: tensors by shape and dtype (not value), other values by value."""
    if isinstance(obj, torch.Tensor):
        return hash((tuple(obj.shape), obj.dtype))
    if isinstance(obj, (list, tuple)):
        return hash(tuple(input_hash(o) for o in obj))
    if isinstance(obj, dict):
        return hash(tuple((k, input_hash(v)) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))))
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return input_hash({k: v for k, v in vars(obj).items() if not k.startswith("_")})
    try:
        return hash(obj)
    except TypeError:
        return hash(repr(obj))


def wrap_in_hpu_graph(
    module,
    asynchronous: bool = False,
    disable_tensor_cache: bool = False,
    dry_run: bool = False,
    max_graphs=None,
    **kwargs,
):
    """Return ``module`` with its forward accepting ``bypass_hpu_graphs`` and counted as a graph."""
    if getattr(module, "__hpu_graph_wrapped__", False):
        return module
    forward = module.forward
    signatures: set = set()

    @functools.wraps(forward)
    def graphed(*args, bypass_hpu_graphs: bool = False, **kw):
        if bypass_hpu_graphs or not is_lazy():
            return forward(*args, **kw)
        signatures.add(input_hash((args, kw)))
        with counting.graph_region():
            return forward(*args, **kw)

    module.forward = graphed
    module.__hpu_graph_wrapped__ = True
    module.__hpu_graph_signatures__ = signatures
    return module


class HPUGraph:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("torch.hpu.graphs.HPUGraph (explicit capture) is not emulated (hpu_emulation)")
