"""The ``hpu`` device on the CPU: a tensor subclass that reports ``hpu:0`` and computes on a CPU tensor.

Why a subclass and not a device alias: the runner and the ports branch on ``tensor.device``, the
card's index semantics must apply to card tensors only, a copy to the host is a host
synchronisation, and card memory is counted per allocation. None of that is possible when
``hpu`` tensors are plain CPU tensors.

How: ``HPUTensor`` is a wrapper subclass (no storage of its own; its ``elem`` holds the data).
Every torch call that sees one goes through ``__torch_function__`` first, where the arguments are
unwrapped, the call runs on the CPU, and tensor results are wrapped again; this happens before
PyTorch's Python bindings look for a device guard, which does not exist for ``hpu`` in a CPU
build. Calls made from C++ on a wrapper (inside composite kernels) reach ``__torch_dispatch__``,
which does the same. Creation on the device (``torch.zeros(..., device='hpu')``, ``x.to('hpu')``)
is caught by a torch-function mode that is pushed when the emulation is activated, and, for
creation from C++, by ``empty``/``empty_strided`` kernels registered for the HPU dispatch key.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from hpu_emulation import counting, memory, refusals

HPU = torch.device("hpu", 0)
_state = threading.local()


def _unwrap(x: Any) -> Any:
    return x._elem if isinstance(x, HPUTensor) else x


def _is_hpu_device(dev: Any) -> bool:
    if dev is None:
        return False
    if isinstance(dev, torch.device):
        return dev.type == "hpu"
    if isinstance(dev, str):
        return dev.split(":")[0] == "hpu"
    # A bare index names a card of the current accelerator (at::getAccelerator detects HPU on a
    # Gaudi host; vLLM's platform passes torch.hpu.current_device(), an int, as ``device=``).
    if isinstance(dev, int) and not isinstance(dev, bool):
        return True
    return False


class HPUTensor(torch.Tensor):
    """A tensor on the emulated card. ``_elem`` is the CPU tensor that holds its data."""

    _elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> HPUTensor:
        if isinstance(elem, HPUTensor):  # never nest
            return elem
        return HPUTensor._build(cls, elem)

    @staticmethod
    def _build(cls: type, elem: torch.Tensor) -> Any:
        refusals.check_dtype(elem.dtype)  # float64 / complex: not on a card
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=HPU,
            requires_grad=elem.requires_grad,
        )
        r._elem = elem
        memory.track(r, elem)
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        with torch._C.DisableTorchFunctionSubclass():
            body = repr(self._elem)
        return body.rstrip(")") + ", device='hpu:0')" if body.endswith(")") else body

    def data_ptr(self) -> int:  # type: ignore[override]
        # The host address of the data: unique and stable like a device address.
        return self._elem.data_ptr()

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        try:
            return _on_function(func, args, kwargs or {})
        except refusals.CardRefusal as exc:
            exc.name_op(func)  # the outermost call a refusal reached names it
            raise

    @classmethod
    def __torch_dispatch__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        # Reached only for calls made from C++ on a wrapper (a composite kernel's inner ops).
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs or {}))
        return _rewrap(out, args, kwargs or {})


def _rewrap(out: Any, args: tuple, kwargs: dict) -> Any:
    """Wrap tensor results; a result that is an input's own data (in-place, out=) is that input."""
    if not isinstance(out, (torch.Tensor, list, tuple, dict)) or type(out) is torch.Size:
        return out
    owners: dict[int, HPUTensor] = {}

    def note(x: Any) -> Any:
        if isinstance(x, HPUTensor):
            owners[id(x._elem)] = x
        return x

    tree_map(note, (args, kwargs))

    def wrap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, HPUTensor):
            owner = owners.get(id(x))
            return owner if owner is not None else HPUTensor(x)
        return x

    return tree_map(wrap, out)


# --- parameters on the card --------------------------------------------------------------------
# ``nn.Parameter(card_tensor)`` (and vLLM's Parameter subclasses, which carry the weight loaders)
# must give an instance of the Parameter class asked for that is also a card tensor: a class that
# derives from both is made once per Parameter class.
_PARAM_CLASSES: dict[type, type] = {}
_parameter_new = torch.nn.Parameter.__new__


def _card_parameter_class(cls: type) -> type:
    combined = _PARAM_CLASSES.get(cls)
    if combined is None:
        combined = type(f"HPU{cls.__name__}", (HPUTensor, cls), {"__module__": __name__})
        _PARAM_CLASSES[cls] = combined
    return combined


def _new_parameter(cls, data=None, requires_grad=True):
    if isinstance(data, HPUTensor):
        elem = data._elem.detach().requires_grad_(requires_grad)
        return HPUTensor._build(_card_parameter_class(cls), elem)
    return _parameter_new(cls, data, requires_grad)


# --- the device's index semantics -------------------------------------------------------------
# vllm-gaudi pads token ids, positions, slots and block ids with -1 and gives each indexed table a
# spare last row; the card wraps a negative index to the last row where a CPU kernel raises. These
# are inferred from vllm-gaudi's design (claims a card must confirm: README, "Fidelity"; device_gate.py).


def _wrap_negative(index: torch.Tensor, size: int) -> torch.Tensor:
    return torch.where(index < 0, index + size, index)


def _index_select(self, dim, index):
    return torch.index_select(self, dim, _wrap_negative(index, self.size(dim)))


def _embedding(input, weight, *args, **kwargs):
    return torch.nn.functional.embedding(_wrap_negative(input, weight.size(0)), weight, *args, **kwargs)


def _index_copy(inplace: bool):
    def run(self, dim, index, source, **kwargs):
        index = _wrap_negative(index, self.size(dim))
        return self.index_copy_(dim, index, source) if inplace else self.index_copy(dim, index, source)

    return run


def _index_reduce(inplace: bool):
    def run(self, dim, index, source, reduce, **kwargs):
        index = _wrap_negative(index, self.size(dim))
        fn = self.index_reduce_ if inplace else self.index_reduce
        return fn(dim, index, source, reduce, **kwargs)

    return run


def _one_hot(tensor, num_classes=-1):
    # An out-of-range class gives an all-zero row on the card (vllm-gaudi's own fake-HPU branch
    # says the CPU kernel "doesn't handle out of bounds classes").
    if num_classes < 0:
        return torch.nn.functional.one_hot(tensor, num_classes)
    valid = (tensor >= 0) & (tensor < num_classes)
    rows = torch.nn.functional.one_hot(torch.where(valid, tensor, 0), num_classes)
    return rows * valid.unsqueeze(-1).to(rows.dtype)


_SEMANTICS: dict[Any, Callable] = {
    torch.index_select: _index_select,
    torch.Tensor.index_select: _index_select,
    torch.nn.functional.embedding: _embedding,
    torch.Tensor.index_copy_: _index_copy(True),
    torch.Tensor.index_copy: _index_copy(False),
    torch.index_copy: _index_copy(False),
    torch.Tensor.index_reduce_: _index_reduce(True),
    torch.Tensor.index_reduce: _index_reduce(False),
    torch.index_reduce: _index_reduce(False),
    torch.nn.functional.one_hot: _one_hot,
}

# --- host synchronisations ----------------------------------------------------------------------
# Calls whose result the host must wait for: a value read back, or an output whose shape depends on
# the data. Inside a captured HPU graph each one would break the capture or replay stale values.
_SYNC_ALWAYS = {
    torch.Tensor.item: ".item()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.__bool__: "bool()",
    torch.Tensor.__int__: "int()",
    torch.Tensor.__float__: "float()",
    torch.Tensor.__index__: "index()",
    torch.Tensor.nonzero: "nonzero",
    torch.nonzero: "nonzero",
    torch.argwhere: "argwhere",
    torch.Tensor.unique: "unique",
    torch.unique: "unique",
    torch.unique_consecutive: "unique_consecutive",
    torch.Tensor.unique_consecutive: "unique_consecutive",
    torch.masked_select: "masked_select",
    torch.Tensor.masked_select: "masked_select",
    torch.bincount: "bincount",
    torch.Tensor.bincount: "bincount",
    torch.equal: "equal",
    torch.allclose: "allclose",
    torch.Tensor.cpu: ".cpu()",
}


def _sync_reason(func: Any, args: tuple, kwargs: dict) -> str | None:
    reason = _SYNC_ALWAYS.get(func)
    if reason is not None:
        return reason
    if func in (torch.where,) and len(args) + len(kwargs) == 1:
        return "torch.where(cond)"
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave) and kwargs.get("output_size") is None:
        if len(args) > 1 and isinstance(args[1], torch.Tensor):
            return "repeat_interleave without output_size"
    if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return "boolean-mask indexing"
    return None


# --- the entry point for every torch call on a card tensor -------------------------------------
_DEVICE_PROPS = {
    torch.Tensor.device.__get__: lambda self: HPU,  # type: ignore[attr-defined]
    torch.Tensor.is_cpu.__get__: lambda self: False,  # type: ignore[attr-defined]
    torch.Tensor.is_cuda.__get__: lambda self: False,  # type: ignore[attr-defined]
    torch.Tensor.get_device: lambda self: 0,
}


def _to(self: Any, *args: Any, **kwargs: Any) -> Any:
    # torch's argument parser for .to() takes no copy=; Tensor.to itself does (transformers'
    # generate calls .to(copy=True, dtype=..., device=...)), so it is taken out first
    copy = bool(kwargs.pop("copy", False))
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    extra = {"memory_format": memory_format} if memory_format is not None else {}
    if isinstance(self, HPUTensor):
        if device is None or _is_hpu_device(device):
            out = self._elem.to(dtype=dtype or self.dtype, copy=copy, **extra)
            return self if out is self._elem else HPUTensor(out)
        counting.host_sync(".to(host)")
        # Leaving the card is always a copy: a host tensor never aliases card memory.
        return self._elem.to(device=device, dtype=dtype or self.dtype, copy=True, **extra)
    if _is_hpu_device(device):
        return HPUTensor(self.to(dtype=dtype or self.dtype, copy=True, **extra))
    return NotImplemented


def _set_data(self: Any, new: Any) -> None:
    new = new if isinstance(new, HPUTensor) else HPUTensor(new)
    with torch._C.DisableTorchFunctionSubclass():
        torch.Tensor.data.__set__(self, new)  # type: ignore[attr-defined]
    self._elem = new._elem
    memory.track(self, self._elem)


def _compatible_shallow_copy(a: Any, b: Any) -> bool:
    # A host tensor's TensorImpl must never take a card tensor's data through ``.data =``: it would
    # report ``hpu`` with no data behind it. Module.to('hpu') then builds new parameters instead.
    if isinstance(a, HPUTensor) != isinstance(b, HPUTensor):
        return False
    with torch._C.DisableTorchFunctionSubclass():
        return torch._has_compatible_shallow_copy_type(_unwrap(a), _unwrap(b))


_SPECIAL: dict[Any, Callable] = {
    torch.Tensor.to: _to,
    torch._has_compatible_shallow_copy_type: _compatible_shallow_copy,
    torch.Tensor.data.__set__: _set_data,  # type: ignore[attr-defined]
}


# Metadata the wrapper holds itself: answered without unwrapping (the hot path of every model).
_METADATA = {
    torch.Tensor.shape.__get__,  # type: ignore[attr-defined]
    torch.Tensor.dtype.__get__,  # type: ignore[attr-defined]
    torch.Tensor.ndim.__get__,  # type: ignore[attr-defined]
    torch.Tensor.layout.__get__,  # type: ignore[attr-defined]
    torch.Tensor.size,
    torch.Tensor.dim,
    torch.Tensor.stride,
    torch.Tensor.numel,
    torch.Tensor.nelement,
    torch.Tensor.element_size,
    torch.Tensor.storage_offset,
    torch.Tensor.is_floating_point,
    torch.Tensor.__len__,
}


_HPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.HPU)
_HPU_ONLY: dict[Any, Any] = {}


def _hpu_only_kernel(func: Any) -> Any:
    """An op whose only kernel is registered for the HPU dispatch key (vLLM registers its custom ops
    for the platform's key): run that kernel on the unwrapped data instead of looking for a CPU one."""
    if func in _HPU_ONLY:
        return _HPU_ONLY[func]
    op = func
    if isinstance(func, torch._ops.OpOverloadPacket):
        names = func.overloads()
        op = getattr(func, names[0]) if len(names) == 1 else None
    found = None
    if isinstance(op, torch._ops.OpOverload):
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        name = op.name()
        others = ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd")
        if has(name, "HPU") and not any(has(name, key) for key in others):
            found = op
    _HPU_ONLY[func] = found
    return found


def _on_function(func: Callable, args: tuple, kwargs: dict) -> Any:
    if func in _METADATA:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    prop = _DEVICE_PROPS.get(func)
    if prop is not None:
        return prop(args[0])
    # What a card refuses, and how it reads stored FP8 bytes (refusals.py)
    refusals.check_devices(func, args, kwargs, HPUTensor)
    card_values = refusals.fp8_reads(func, args, kwargs, HPUTensor)
    special = _SPECIAL.get(func) if card_values is None else None
    if special is not None:
        out = special(*args, **kwargs)
        if out is not NotImplemented:
            return out
    if func is torch.Tensor.__repr__:
        return args[0].__repr__()
    reason = _sync_reason(func, args, kwargs)
    if reason is not None:
        counting.host_sync(reason)
    func = _SEMANTICS.get(func, func)
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        op = _hpu_only_kernel(func)
        if op is not None:
            func = functools.partial(op.redispatch, _HPU_KEYSET)
    with torch._C.DisableTorchFunctionSubclass():
        unwrapped_args = tree_map(_unwrap, args)
        unwrapped_kwargs = tree_map(_unwrap, kwargs)
        if card_values is not None:
            unwrapped_args, unwrapped_kwargs = card_values(unwrapped_args, unwrapped_kwargs)
        with counting.ops_of(func):
            out = func(*unwrapped_args, **unwrapped_kwargs)
    if func is torch.Tensor.cpu or reason in (".numpy()", ".tolist()"):
        return out if not isinstance(out, torch.Tensor) or out is not _unwrap(args[0]) else out.clone()
    return _rewrap(out, args, kwargs)


# --- creation on the device ---------------------------------------------------------------------


class DeviceMode(TorchFunctionMode):
    """Creation on ``hpu`` from Python: ``torch.zeros(..., device='hpu')``, ``cpu_tensor.to('hpu')``."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        try:
            return self._create(func, args, kwargs or {})
        except refusals.CardRefusal as exc:
            exc.name_op(func)
            raise

    def _create(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        if kwargs.get("pin_memory"):
            # Page-locked host memory is what a card's DMA copies from; a CPU build of torch can
            # only pin through a CUDA driver. The emulated card reads host memory as it is.
            kwargs = dict(kwargs, pin_memory=False)
        if func is torch.Tensor.to and args and not isinstance(args[0], HPUTensor):
            out = _to(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if _is_hpu_device(kwargs.get("device")):
            out = func(*args, **dict(kwargs, device="cpu"))
            return tree_map(lambda t: HPUTensor(t) if type(t) is torch.Tensor else t, out)
        return func(*args, **kwargs)


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return HPUTensor(torch.empty(size, dtype=dtype, layout=layout, device="cpu", memory_format=memory_format))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return HPUTensor(torch.empty_strided(size, stride, dtype=dtype, layout=layout, device="cpu"))


_TorchGenerator = torch._C.Generator


class _GeneratorMeta(type(_TorchGenerator)):  # type: ignore[misc]
    # Every torch generator (the default ones made in C++ included) is a ``torch.Generator``.
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _TorchGenerator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _TorchGenerator)


class Generator(_TorchGenerator, metaclass=_GeneratorMeta):
    """``torch.Generator(device='hpu')``: a CPU generator, since the emulated card computes on the
    CPU (the runner seeds one per seeded request and samples on the card with it). Seeded requests
    are reproducible; their draws are the CPU generator's, not a card's. Any other device is
    torch's own generator."""

    def __new__(cls, device: Any = None) -> Any:  # type: ignore[misc]
        if _is_hpu_device(device):
            return _TorchGenerator("cpu")
        return _TorchGenerator() if device is None else _TorchGenerator(device)


_LIBRARIES: list[torch.library.Library] = []
_MODE: list[DeviceMode] = []


def install(device_module: types.ModuleType) -> None:
    """Register the device module as ``torch.hpu`` and make creation on ``hpu`` work. Idempotent."""
    if _MODE:
        return
    if "hpu" not in vars(torch) or getattr(torch, "hpu", None) is not device_module:
        torch._register_device_module("hpu", device_module)
    torch.nn.Parameter.__new__ = _new_parameter  # type: ignore[method-assign]
    torch.Generator = Generator  # type: ignore[misc]
    lib = torch.library.Library("aten", "IMPL", "HPU")
    lib.impl("empty.memory_format", _empty_memory_format)
    lib.impl("empty_strided", _empty_strided)
    _LIBRARIES.append(lib)
    mode = DeviceMode()
    mode.__enter__()
    _MODE.append(mode)
    _patch_thread_start(mode)


def _patch_thread_start(mode: DeviceMode) -> None:
    # Torch-function modes are per thread; threads the runner starts (async output, loaders) must
    # create on the card too.
    original = threading.Thread.run
    if getattr(original, "__hpu_emulation__", False):
        return

    def run(self: threading.Thread) -> None:
        with DeviceMode():
            original(self)

    run.__hpu_emulation__ = True  # type: ignore[attr-defined]
    threading.Thread.run = run  # type: ignore[method-assign]


def to_hpu(t: torch.Tensor) -> HPUTensor:
    return t if isinstance(t, HPUTensor) else HPUTensor(t.clone())


def is_hpu(t: Any) -> bool:
    return isinstance(t, HPUTensor)


__all__ = ["HPU", "HPUTensor", "install", "is_hpu", "to_hpu"]
