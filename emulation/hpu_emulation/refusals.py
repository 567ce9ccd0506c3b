"""What a Gaudi card refuses, refused on card tensors only (host tensors keep the CPU's rules).

Each refusal is a :class:`CardRefusal` (a ``RuntimeError``, as the bridge raises; never
``NotEmulated``, which the unit-test harness would turn into a skip) whose message names the op
and the card rule. ``device.py`` calls the checks from its dispatch path; the rules and their
sources are here and in the fidelity table of ``emulation/README.md``.

1. **Host and card tensors in one op** (:func:`check_devices`). Intel's bridge
   (HabanaAI/gaudi-pytorch-bridge 1.19.0): in eager mode ``habana_eager/ops/eager_op.cpp``
   (``EagerOpBase::validate_inputs``) refuses a host tensor input with "Expected all tensors to be
   on the HPU device, but found at least one input[idx=N] on cpu", except a wrapped number or a
   **0-dim host tensor**, which it takes as a scalar (and ``masked_fill``'s value, 0-dim anyway);
   a host tensor inside a tensor list (``cat``, ``stack``) is refused even when 0-dim
   (``habana_eager/eager_exec.cpp``, the list branch asserts every element is on the HPU). In lazy
   mode the same input is copied to the card at every call (``habana_kernels/lazy_kernels.h``,
   ``set_inputs``: "Any tensor on CPU needs to be moved to HPU"): a host-to-card transfer per op.
   The emulation refuses it in eager mode (``PT_HPU_LAZY_MODE=0``) and, in lazy mode, inside a
   region the runner captures as an HPU graph (``counting.in_graph()``), where the copy would be
   recorded with the host value of the capture and replayed with it; outside a captured region in
   lazy mode it runs, as the bridge copies it (vllm-gaudi's greedy rejection sampler returns its
   tokens on the host, and vLLM's logprobs gather then indexes card logits with them).
   Allowed, as the bridge allows: 0-dim host tensors; host index tensors of a card tensor's
   advanced indexing (``index``: ``hpu_ops/eager/index_gen.cpp`` runs it as a CPU fallback) and
   host indices and values of ``index_put_`` / ``__setitem__`` (``habana_eager/ops/index_put.cpp``
   copies them to the card); transfers (``copy_``, ``to``, ``type_as``, ``new_tensor``, and
   ``host[basic index] = card``, a ``copy_``) and the size-only ``*_as`` views; ``.data =``.
2. **float64 and complex on the card** (:func:`check_dtype`). Intel's PyTorch support matrix
   (docs.habana.ai, PyTorch Support Matrix, "Data Types") lists Float64, Complex32 and Complex64
   as not supported in both modes. The bridge raises "Complex datatype is not supported on HPU
   device." (``backend/helpers/tensor_utils.cpp``, ``is_supported_type``); a float64 tensor it
   keeps silently as float32 ("HPU is implicitly casting Long to Int and Double to Float without
   showing this information to torch", same file). The emulation refuses both: code that asks
   for float64 on the card gets float32 precision on a card without being told.
3. **Stored e4m3fn bytes read as the card reads them** (:func:`fp8_reads`): a dtype conversion
   of a card tensor of ``torch.float8_e4m3fn`` on the card (``.to(dtype)``, ``.float()`` and
   the like, ``copy_`` / ``__setitem__`` into a wider card tensor) reads its bytes through
   ``kernels.fp8.card_read``: on an emulated Gaudi 2 the codes above 240 read as inf / NaN (its
   docstring gives the sources), on Gaudi 3 the full 448 range. Moving the bytes (views, copies,
   ``.to('cpu')``) keeps them exact: vllm-gaudi's ``per_tensor_dequantize`` moves the weight to
   the host and converts it there "to avoid nan on gaudi2".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import config, counting
from .kernels import fp8 as _fp8


class CardRefusal(RuntimeError):
    """An op a Gaudi card refuses. The message names the op (set by the first call that sees it)."""

    def __init__(self, rule: str, op: Any = None) -> None:
        self.rule = rule
        self.op = None
        super().__init__(rule)
        if op is not None:
            self.name_op(op)

    def name_op(self, op: Any) -> CardRefusal:
        if self.op is None:
            self.op = op
            self.args = (f"{op_name(op)}: {self.rule}",)
        return self


def op_name(func: Any) -> str:
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{func}" if not str(func).startswith("torch.ops") else str(func)
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    if qual.startswith(("Tensor.", "TensorBase.", "_TensorBase.")):
        return "Tensor." + qual.split(".", 1)[1]
    if qual.startswith("_VariableFunctionsClass."):
        return "torch." + qual.split(".", 1)[1]
    if module and module.startswith("torch") and "." not in qual:
        return f"{module.replace('torch._C._nn', 'torch.nn.functional').replace('torch._C._VariableFunctions', 'torch')}.{qual}"
    return qual


# --- 1. host and card tensors in one op ----------------------------------------------------------

_TRANSFERS: set[Any] = {
    torch.Tensor.copy_,
    torch.Tensor.to,
    torch.Tensor.type_as,
    torch.Tensor.new_tensor,
    torch.Tensor.expand_as,
    torch.Tensor.view_as,
    torch.Tensor.reshape_as,
    torch.Tensor.data.__set__,  # type: ignore[attr-defined]
    torch._has_compatible_shallow_copy_type,
}
# self is args[0]; host tensors after it (indices, values) are allowed when self is a card tensor
_INDEXING: set[Any] = {
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch.Tensor.index_put_,
    torch.Tensor.index_put,
    torch.index_put,
    torch.index_put_,
}

MIXED_RULE = (
    "Expected all tensors to be on the same device, but found at least two devices, hpu:0 and cpu! "
    "({where} is a host tensor of shape {shape}; {mode}). A Gaudi card's bridge refuses a host tensor in a "
    "card op in eager mode ('Expected all tensors to be on the HPU device, but found at least one "
    "input[idx=N] on cpu', habana_eager/ops/eager_op.cpp); lazy mode copies it to the card at every call "
    "(habana_kernels/lazy_kernels.h), which inside a captured HPU graph records the host value of the "
    "capture. Allowed: 0-dim host tensors (taken as scalars, not inside a tensor list), host indices and "
    "values in a card tensor's indexing, and transfers (copy_, to). Move the tensor to the card once, "
    "outside the step (hpu_emulation.refusals)"
)


def _is_host(t: torch.Tensor, card_type: type) -> bool:
    return not isinstance(t, card_type) and t.device.type == "cpu"


def check_devices(func: Any, args: tuple, kwargs: dict, card_type: type) -> None:
    """Raise :class:`CardRefusal` when ``func`` mixes a host tensor into a call on card tensors,
    beyond what the bridge allows (module docstring). Called only for calls that hold a card tensor."""
    if func in _TRANSFERS:
        return
    if func is torch.Tensor.__setitem__ and len(args) > 2 and not isinstance(args[0], card_type):
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if not any(isinstance(i, torch.Tensor) for i in index):
            return  # host[basic index] = card: a copy to the host (copy_), a transfer
    indexing = func in _INDEXING and bool(args) and isinstance(args[0], card_type)
    for where, value in _inputs(args, kwargs):
        if isinstance(value, torch.Tensor):
            if not _is_host(value, card_type):
                continue
            if value.dim() == 0 or (indexing and where != "input[idx=0]"):
                continue
            _refuse_host(func, where, value)
        elif isinstance(value, (list, tuple)):
            for j, item in enumerate(value):
                if indexing and where != "input[idx=0]":
                    break  # a tuple of indices
                if isinstance(item, torch.Tensor) and _is_host(item, card_type):
                    _refuse_host(func, f"{where}[{j}] (an element of a tensor list)", item)


def _inputs(args: tuple, kwargs: dict):
    for i, a in enumerate(args):
        yield f"input[idx={i}]", a
    for k, v in kwargs.items():
        yield f"argument {k!r}", v


def _refuse_host(func: Any, where: str, t: torch.Tensor) -> None:
    if not config.is_lazy():
        mode = "eager mode, PT_HPU_LAZY_MODE=0"
    elif counting.in_graph():
        mode = "lazy mode, inside a region captured as an HPU graph"
    else:
        return  # lazy mode outside a captured region: the bridge copies the host tensor to the card
    raise CardRefusal(MIXED_RULE.format(where=where, shape=list(t.shape), mode=mode), func)


# --- 2. float64 and complex on the card -------------------------------------------------------------

REFUSED_DTYPES = {
    torch.float64: (
        "float64 on hpu: Intel's PyTorch support matrix lists Float64 as not supported on Gaudi (the "
        "bridge keeps it silently as float32: backend/helpers/tensor_utils.cpp); compute in float32 or on "
        "the host (hpu_emulation.refusals)"
    ),
    torch.complex32: "Complex datatype is not supported on HPU device. (complex32 on hpu; {why})",
    torch.complex64: "Complex datatype is not supported on HPU device. (complex64 on hpu; {why})",
    torch.complex128: "Complex datatype is not supported on HPU device. (complex128 on hpu; {why})",
}
_COMPLEX_WHY = (
    "the bridge's is_supported_type, backend/helpers/tensor_utils.cpp; Intel's PyTorch support matrix lists "
    "Complex32 and Complex64 as not supported; use real arithmetic, as vllm-gaudi's rotary embeddings do "
    "(hpu_emulation.refusals)"
)


def check_dtype(dtype: torch.dtype, op: Any = None) -> None:
    """Raise :class:`CardRefusal` for a card tensor of a dtype the card does not hold."""
    rule = REFUSED_DTYPES.get(dtype)
    if rule is not None:
        raise CardRefusal(rule.format(why=_COMPLEX_WHY), op)


# --- 3. stored e4m3fn bytes read as the card reads them ------------------------------------------

_CONVERSIONS: dict[Any, torch.dtype | None] = {
    torch.Tensor.float: torch.float32,
    torch.Tensor.bfloat16: torch.bfloat16,
    torch.Tensor.half: torch.float16,
    torch.Tensor.double: torch.float64,
    torch.Tensor.to: None,  # parsed
    torch.Tensor.type: None,
    torch.Tensor.type_as: None,
}


def _reads(card_type: type, t: Any) -> bool:
    return isinstance(t, card_type) and _fp8.card_reads_differently(t.dtype)


def _target(func: Any, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype a conversion of ``args[0]`` produces on the card; None when it is not one (a move
    to the host, the same dtype, a string type)."""
    want = _CONVERSIONS[func]
    if want is not None:
        return want
    if func is torch.Tensor.to:
        kw = {k: v for k, v in kwargs.items() if k != "copy"}
        device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kw)
        if device is not None and torch.device(device).type != "hpu":
            return None
        return dtype
    if func is torch.Tensor.type_as:
        return args[1].dtype if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    return dtype if isinstance(dtype, torch.dtype) else None


def fp8_reads(func: Any, args: tuple, kwargs: dict, card_type: type) -> Callable[[list, dict], tuple] | None:
    """For a call that reads stored e4m3fn card bytes as values the card reads differently than
    PyTorch (an emulated Gaudi 2), the function that maps the call's unwrapped ``(args, kwargs)`` to
    the same call on those inputs' values as the card reads them (``kernels.fp8.card_read``,
    float32); None for any other call."""
    if func in _CONVERSIONS:
        if not args or not _reads(card_type, args[0]):
            return None
        dtype = _target(func, args, kwargs)
        if dtype is None or dtype == args[0].dtype:
            return None
        if func is torch.Tensor.to:  # a conversion on the card: the device part is the card's already
            return lambda a, kw: ([_fp8.card_read(a[0])], {"dtype": dtype})
        return _replacing(0)
    if func is torch.Tensor.copy_ and len(args) > 1:
        dst, src = args[0], args[1]
        if isinstance(dst, card_type) and _reads(card_type, src) and dst.dtype != src.dtype:
            return _replacing(1)
        return None
    if func is torch.Tensor.__setitem__ and len(args) > 2:
        dst, value = args[0], args[2]
        if isinstance(dst, card_type) and _reads(card_type, value) and dst.dtype != value.dtype:
            return _replacing(2)
    return None


def _replacing(i: int) -> Callable[[list, dict], tuple]:
    def replace(unwrapped: list | tuple, kwargs: dict) -> tuple:
        out = list(unwrapped)
        out[i] = _fp8.card_read(out[i])
        return out, kwargs

    return replace


__all__ = ["CardRefusal", "check_devices", "check_dtype", "fp8_reads"]
