"""A rank-sized linear layer whose weights and GEMM are a vLLM quantization method's.

The port's tensor parallelism is its own arithmetic on rank-sized layers (``parallel.py``). When
vLLM hands the model a quantization config of its own (``Fp8Config`` from a block-FP8
checkpoint's quantization_config: the HPU path), ``parallel.make_linear`` builds this layer
instead of the plain ``nn.Linear`` one. It is a vLLM ``LinearBase``, so the config's
``get_quant_method(layer, prefix)`` picks the method exactly as for vLLM's own linear layers
(``Fp8LinearMethod`` -- vllm-gaudi's subclass on HPU -- or ``UnquantizedLinearMethod`` for a
module in modules_to_not_convert), and the method's ``create_weights`` makes the parameters:
for block FP8 a float8_e4m3fn ``weight`` of the rank's shape and an fp32 ``weight_scale_inv``
with one value per block of it. The split is the port's, not vLLM's: ``disable_tp`` keeps
LinearBase away from the TP group, and the rank and size are set from ``Parallel`` so that
vLLM's block-shape check (a rank's rows or columns must be whole blocks) sees this layer's split.

The parameters carry ``glm5_shard_dim`` (the scale splits with the weight: block rows for a
column-parallel layer, block columns for a row-parallel one) and are filled by the port's
loader through their ``weight_loader`` (``_copy``), which vllm-gaudi wraps on Gaudi2. The
forward is the method's ``apply``; the bias and the all-reduce follow ``ColumnLinear`` /
``RowLinear``. ``process_weights_after_loading`` is vLLM's loader's call, on the method.
"""

from __future__ import annotations

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearBase

from .loader import mark
from .parallel import Parallel, divide

SHARD_DIM = {"column": 0, "row": 1, "replicated": None}


class Glm5NextQuantLinear(LinearBase):
    def __init__(
        self,
        kind: str,
        in_features: int,
        out_features: int,
        par: Parallel,
        what: str,
        *,
        bias: bool,
        reduce: bool,
        quant_config,
        prefix: str,
        params_dtype: torch.dtype | None = None,
    ):
        if kind not in SHARD_DIM:
            raise ValueError(f"{prefix}: linear kind {kind!r}, expected one of {sorted(SHARD_DIM)}")
        in_rank = divide(in_features, par.size, what) if kind == "row" else in_features
        out_rank = divide(out_features, par.size, what) if kind == "column" else out_features
        super().__init__(
            in_features,
            out_features,
            bias=bias,
            params_dtype=params_dtype,
            quant_config=quant_config,
            prefix=prefix,
            return_bias=False,
            disable_tp=True,
        )
        self.kind, self.par, self.reduce = kind, par, reduce
        self.tp_rank, self.tp_size = (0, 1) if kind == "replicated" else (par.rank, par.size)
        self.quant_method.create_weights(
            self, in_rank, [out_rank], in_features, out_features, self.params_dtype, weight_loader=self._copy
        )
        dim = SHARD_DIM[kind]
        for p in self.parameters(recurse=False):
            mark(p, glm5_shard_dim=dim, glm5_weight_loader=True)
        if bias:
            self.bias = Parameter(torch.empty(out_rank, dtype=self.params_dtype), requires_grad=False)
            mark(self.bias, glm5_shard_dim=0 if kind == "column" else None)
        else:
            self.register_parameter("bias", None)

    @staticmethod
    def _copy(param: torch.Tensor, loaded: torch.Tensor, dest: torch.Tensor | None = None) -> None:
        """The parameter's weight_loader: ``loaded`` is already this rank's region (the port's loader
        narrowed and checked it); ``dest`` the region of ``param`` it fills (the whole by default)."""
        dest = param.data if dest is None else dest
        # An unquantized module's weight is cast to the model dtype as vLLM's default loader casts it
        # (an fp32-stored checkpoint served in bf16); FP8 bytes and scales only ever land as they are.
        fp8 = {loaded.dtype, dest.dtype} & {torch.float8_e4m3fn, torch.float8_e4m3fnuz}
        cast = not fp8 and loaded.dtype.is_floating_point and dest.dtype.is_floating_point
        if dest.shape != loaded.shape or (dest.dtype != loaded.dtype and not cast):
            raise ValueError(
                f"weight_loader: {tuple(loaded.shape)} {loaded.dtype} into {tuple(dest.shape)} {dest.dtype}"
            )
        dest.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        row = self.kind == "row"
        y = self.quant_method.apply(self, x, None if row and self.par.rank != 0 else self.bias)
        return self.par.all_reduce(y) if row and self.reduce else y

    def extra_repr(self) -> str:
        return f"{self.kind}, in={self.input_size}, out={self.output_size}, rank={self.tp_rank}/{self.tp_size}"
