"""GLM_MXK / GLM_MXK_PREFILL on vllm-gaudi's MXFP4 MoE: the GLM kernels dispatched by call size.

vllm-gaudi's ``HPUMxfp4MoEMethod`` (the port's patch mxfp4-moe-non-gpt-oss) routes the tokens and
calls ``layer.moe_op`` (``VllmMixtureOfExpertsOpMXFP4``: the stock fused MXFP4 op). With either
switch on, that op is wrapped by :class:`GlmMxkMoEOp`, which takes each call by its token count:

* **decode-sized** (at most ``DECODE_MAX`` tokens, GLM_MXK=1): per (token, chosen expert) pair, the
  GEMV kernel on the expert's packed gate/up rows, SiLU(gate) x up rounded to bf16, the GEMV
  kernel on its packed down rows, weighted by the router and summed in float32 in the order the
  pairs come (a token's k choices in the router's order). Only the chosen experts' bytes are read;
  the loop has a static length (tokens x top-k), so a captured decode step replays it. An expert
  another rank holds (expert parallelism) adds nothing.
* **prefill-sized** (``PREFILL_MIN`` to ``PREFILL_MAX`` tokens, GLM_MXK_PREFILL=1): every local
  expert unpacked to bf16 by the unpack kernel, then vllm-gaudi's stock bf16 fused MoE op. Every
  MXFP4 weight is exact in bf16, so this is the stock MXFP4 op's computation on the same values.
* anything else: the stock op.

The kernels: ``torch.ops.hpu_glm.mxfp4_gemv`` / ``mxfp4_unpack`` when their library is loaded
(kernels/mxfp4-moe/build.sh builds it; :func:`kernels` finds it); on the Habana emulation the
kernels' operation order in PyTorch (glm5_hpu/mxk.py, tested bit for bit against the kernels' C
sources); anywhere else no kernels, and the HPU model refuses the switch at start-up.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F

from . import mxk

DECODE_MAX = 16  # MXK_MAX_TOKENS in kernels/mxfp4-moe/mxfp4_gemv_bf16.c
PREFILL_MIN, PREFILL_MAX = 256, 4096  # the calls the unpack kernel serves (port.yaml GLM_MXK_PREFILL)
LIBRARY_ENV = "GLM_MXK_LIBRARY"  # the op library, when not at its build path
OP_LIB, TPC_LIB = "libhpu_glm_mxfp4.so", "libcustom_tpc_glm_mxfp4.so"


@dataclass(frozen=True)
class Kernels:
    gemv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    unpack: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    where: str  # "library PATH" or "emulation"


def on_emulation() -> bool:
    """True inside the project's Habana emulation (its habana_frameworks carries the marker)."""
    return bool(getattr(sys.modules.get("habana_frameworks"), "__hpu_emulation__", False))


def library_candidates() -> list[Path]:
    """Where the op library may be: GLM_MXK_LIBRARY, then build.sh's output under $COOKBOOK and
    beside this package (a checkout)."""
    found = []
    if os.environ.get(LIBRARY_ENV):
        found.append(Path(os.environ[LIBRARY_ENV]))
    for root in (os.environ.get("COOKBOOK"), Path(__file__).resolve().parents[3]):
        if root:
            found.append(Path(root) / "ports" / "glm-5-mxfp4" / "kernels" / "mxfp4-moe" / "build" / OP_LIB)
    return found


def load_library(lib: Path) -> str | None:
    """Load the op library ``lib`` and put its TPC kernels (``libcustom_tpc_glm_mxfp4.so`` beside it)
    on GC_KERNEL_PATH, which the graph compiler reads when the process first acquires the card;
    None when the ops are usable, else why not. kernels/mxfp4-moe/op.py loads through this too."""
    tpc = lib.with_name(TPC_LIB)
    if not tpc.is_file():
        return f"{tpc} missing (build.sh builds it with the op library)"
    try:
        import habana_frameworks.torch  # noqa: F401  (the HPU device and the custom-op runtime)
    except ImportError as exc:
        return f"Gaudi software not importable ({exc})"
    paths = [p for p in os.environ.get("GC_KERNEL_PATH", "").split(":") if p]
    if str(tpc) not in paths:
        os.environ["GC_KERNEL_PATH"] = ":".join([str(tpc), *paths])
    try:
        torch.ops.load_library(str(lib))
        torch.ops.hpu_glm.mxfp4_gemv  # noqa: B018  (resolves the schemas)
        torch.ops.hpu_glm.mxfp4_unpack  # noqa: B018
    except Exception as exc:  # a broken or mismatched build is reported, never half-used
        return f"{lib} failed to load: {exc}"
    return None


@functools.cache  # asked once per MoE layer at model build: found once per process
def kernels() -> Kernels | str:
    """The kernels GLM_MXK / GLM_MXK_PREFILL dispatch to here, or why there are none."""
    why = []
    for lib in library_candidates():
        if lib.is_file():
            problem = load_library(lib)
            if problem is None:
                return Kernels(torch.ops.hpu_glm.mxfp4_gemv, torch.ops.hpu_glm.mxfp4_unpack, f"library {lib}")
            why.append(problem)
    if on_emulation():
        return Kernels(mxk.gemv_bf16, mxk.unpack_bf16, "emulation")
    looked = ", ".join(str(p) for p in library_candidates())
    return (
        "; ".join(why) or f"the MXFP4 MoE kernels are not built (looked for {looked}; run kernels/mxfp4-moe/build.sh)"
    )


def _pick(stacked: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    # one expert's bytes, gathered at a device index (no host read: a captured step keeps its shape)
    return stacked.index_select(0, local).squeeze(0)


class GlmMxkMoEOp(torch.nn.Module):
    """vllm-gaudi's MXFP4 MoE op with the GLM kernels for the calls GLM_MXK / GLM_MXK_PREFILL name
    (module docstring). Called as the stock op is: (hidden_states [T, H], expert ids [T, K] int32,
    router weights [T, K], permuted_weights, activation)."""

    def __init__(
        self,
        stock: torch.nn.Module,
        kernels: Kernels,
        experts: tuple[torch.Tensor, ...],
        *,
        decode: bool,
        prefill: bool,
    ):
        """``experts``: the layer's stacked local experts (w13 U8 [E, 2I, H/2], its scales U8
        [E, 2I, H/32], w2 U8 [E, H, I/2], its scales), the tensors the stock op's per-expert
        weights are views of."""
        super().__init__()
        self.stock = stock
        self.kernels = kernels
        self.w13, self.s13, self.w2, self.s2 = experts
        self.decode, self.prefill = decode, prefill
        op = cast(Any, stock)  # vllm-gaudi's op: its expert range is plain ints, not submodules
        self.experts_min, self.experts_max = int(op.experts_min), int(op.experts_max)

    def path(self, tokens: int) -> str:
        """Which computation a call of ``tokens`` rows takes: "gemv", "unpack" or "stock"."""
        if self.decode and tokens <= DECODE_MAX:
            return "gemv"
        if self.prefill and PREFILL_MIN <= tokens <= PREFILL_MAX:
            return "unpack"
        return "stock"

    def _gemv_moe(self, x, ids, weights, activation):
        if activation not in ("silu", "swiglu"):
            raise NotImplementedError(f"GLM_MXK: activation {activation!r}; glm_moe_dsa uses silu")
        if x.dtype != torch.bfloat16:
            raise TypeError(f"GLM_MXK: activations are {x.dtype}; the GEMV kernel reads bf16")
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        n_local = self.experts_max - self.experts_min + 1
        for t in range(x.shape[0]):
            row = x[t : t + 1]
            for k in range(ids.shape[1]):
                local = ids[t, k : k + 1].long() - self.experts_min
                held = (local >= 0) & (local < n_local)
                local = local.clamp(0, n_local - 1)
                gate, up = (
                    self.kernels.gemv(row, _pick(self.w13, local), _pick(self.s13, local)).float().chunk(2, dim=-1)
                )
                h = (F.silu(gate) * up).to(torch.bfloat16)
                y = self.kernels.gemv(h, _pick(self.w2, local), _pick(self.s2, local)).float()
                out[t] += (y[0] * weights[t, k].float()) * held.float()
        return out.to(x.dtype)

    def _unpack_moe(self, x, ids, weights, activation):
        # the stock bf16 MoE op, called as vllm-gaudi's bf16 method calls it, on the unpacked experts
        w13 = [self.kernels.unpack(self.w13[e], self.s13[e]) for e in range(self.w13.shape[0])]
        w2 = [self.kernels.unpack(self.w2[e], self.s2[e]) for e in range(self.w2.shape[0])]
        return torch.ops.hpu.mixture_of_experts(
            hidden_states=x,
            expert_routing_table=ids,
            router_weights=weights,
            w12=w13,
            w3=w2,
            permuted_weights=True,
            activation=activation,
            experts_min=self.experts_min,
            experts_max=self.experts_max,
        )

    def forward(self, hidden_states, expert_routing_table, router_weights, permuted_weights=True, activation="silu"):
        path = self.path(hidden_states.shape[0])
        if path == "stock" or not permuted_weights:
            return self.stock(
                hidden_states,
                expert_routing_table,
                router_weights,
                permuted_weights=permuted_weights,
                activation=activation,
            )
        activation = getattr(activation, "value", activation)
        activation = str(activation).lower().removeprefix("moeactivation.")
        if path == "gemv":
            return self._gemv_moe(hidden_states, expert_routing_table, router_weights, activation)
        return self._unpack_moe(hidden_states, expert_routing_table, router_weights, activation)
