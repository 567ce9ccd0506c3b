"""The port's exact expert path (GLM5_NEXT_MOE_OP=exact) on block-FP8 experts, on one emulated card,
against the checkpoint's exact weights; built and run in this process with the release tree's vllm
and vllm_gaudi.

    HPU_EMULATION_DEVICE=gaudi2|gaudi3 python expert_fp8_cards.py '{"tree": TREE, "runtime": FOLDER, "out": FILE.pt}'

Run by test_vllm_gaudi_emulation.py once per card, each in a fresh process (vllm-gaudi reads the
card's type at import: ``extension/ops.py``, ``is_hpu_gaudi2``). Nothing is asserted here; it writes
(``torch.save``) what the test asserts on.

The tiny e2e config's routed experts (8 experts, hidden 64, intermediate 32, 16 x 16 blocks) are
quantized as a block-FP8 checkpoint is (per-block absmax to 448: every block holds e4m3fn codes above
240), built on the card as the model builds them (``ParallelExperts``, op exact, the HPU platform)
and loaded by the port's loader. Two loadings:

* ``fixed``: the port as it is: on the HPU platform the experts load through vllm-gaudi's own FP8
  weight loader (``parallel.hpu_fp8_weight_loader``: ``gaudi_weight_wrapper`` on Gaudi 2);
* ``unfixed``: the bytes copied as they are (the port before this fix: ``hpu_fp8_weight_loader``
  returning None).

For each: the experts dequantized on the card (``_w13`` / ``_w2``, ``dequantize_blocks``) in fp32,
and ``forward_static`` in bf16 on 24 tokens routed top-2; the reference is the checkpoint dequantized
on the host with transformers' arithmetic (``fp8.dequantize_block_fp8``, fp32) and the same
``forward_static`` on host tensors with those weights in bf16.
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


def _stream(t, seed: int = 0):
    import torch

    from glm5_next_hpu.vllm.fp8 import quantize_block_fp8

    g = torch.Generator().manual_seed(seed)
    E, D, inter = t.n_routed_experts, t.hidden_size, t.moe_intermediate_size
    stream = []
    for e in range(E):
        for proj, shape in (("gate_proj", (inter, D)), ("up_proj", (inter, D)), ("down_proj", (D, inter))):
            q, s = quantize_block_fp8(torch.randn(*shape, generator=g) / shape[1] ** 0.5, BLOCK)
            stream += [
                (f"{LAYERS}.1.mlp.experts.{e}.{proj}.weight", q),
                (f"{LAYERS}.1.mlp.experts.{e}.{proj}.weight_scale_inv", s),
            ]
    return stream


def _reference(t, stream):
    """fp32 [E, 2I, D] and [E, D, I] from the checkpoint, dequantized on the host (transformers' arithmetic)."""
    import torch

    from glm5_next_hpu.vllm.fp8 import dequantize_block_fp8

    d = dict(stream)
    w13, w2 = [], []
    for e in range(t.n_routed_experts):
        p = f"{LAYERS}.1.mlp.experts.{e}"

        def deq(proj, p=p):
            return dequantize_block_fp8(
                d[f"{p}.{proj}.weight"], d[f"{p}.{proj}.weight_scale_inv"], BLOCK, torch.float32
            )

        w13.append(torch.cat([deq("gate_proj"), deq("up_proj")]))
        w2.append(deq("down_proj"))
    return torch.stack(w13), torch.stack(w2)


def _under(module):
    import torch

    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.language_model = torch.nn.Module()
    root.model.language_model.layers = torch.nn.ModuleDict({"1": torch.nn.Module()})
    root.model.language_model.layers["1"].mlp = torch.nn.Module()
    root.model.language_model.layers["1"].mlp.experts = module
    return root


def _experts(t, stream, loader_fix: bool):
    import torch

    from glm5_next_hpu.vllm import parallel
    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec
    from glm5_next_hpu.vllm.loader import load_checkpoint

    spec = BlockFp8Spec.from_quantization_config({"quant_method": "fp8", "weight_block_size": list(BLOCK)})
    original = parallel.hpu_fp8_weight_loader
    if not loader_fix:
        parallel.hpu_fp8_weight_loader = lambda: None  # the bytes as they are: the port before the fix
    try:
        with torch.device("hpu"):
            experts = parallel.ParallelExperts(t, parallel.Parallel(0, 1, False), BLOCK, op="exact")
    finally:
        parallel.hpu_fp8_weight_loader = original
    report = load_checkpoint(_under(experts), stream, t.num_hidden_layers, fp8=spec)
    return experts.eval(), report


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
    from vllm.plugins import load_general_plugins

    from packtests import flash_reference as rh

    load_general_plugins()
    t = rh.tiny_config().text_config
    vc = VllmConfig()
    object.__setattr__(
        vc,
        "model_config",
        SimpleNamespace(dtype=torch.bfloat16, quantization="fp8", is_moe=True, is_mm_prefix_lm=False),
    )
    with set_current_vllm_config(vc):
        _run(t, spec["out"])


def _run(t, out_path: str) -> None:
    import torch
    from vllm.platforms import current_platform
    from vllm_gaudi.extension import ops as hpu_ops

    from glm5_next_hpu.vllm import parallel
    from hpu_emulation import config

    stream = _stream(t)
    ref13, ref2 = _reference(t, stream)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, t.hidden_size, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(t.n_routed_experts, generator=g)[:2] for _ in range(24)])
    weights = torch.rand(24, 2, generator=g).to(torch.bfloat16)
    host = parallel.ParallelExperts(t, parallel.Parallel(0, 1, False), None, op="exact").to(torch.bfloat16)
    with torch.no_grad():
        host.w13_weight.copy_(ref13.to(torch.bfloat16))
        host.w2_weight.copy_(ref2.to(torch.bfloat16))
        want = host.forward_static(x, weights, ids)
    raw13 = torch.stack(
        [
            torch.cat([dict(stream)[f"{LAYERS}.1.mlp.experts.{e}.{p}.weight"] for p in ("gate_proj", "up_proj")])
            for e in range(t.n_routed_experts)
        ]
    )
    out: dict = dict(
        card=config.card().name,
        is_hpu_gaudi2=bool(hpu_ops.is_hpu_gaudi2),
        platform=getattr(current_platform, "device_type", None),
        ref13=ref13,
        ref2=ref2,
        want=want,
        raw_above_240=int((raw13.float().abs() > 240).sum()),
        raw_values=raw13.numel(),
        runs={},
    )
    for name, fix in (("fixed", True), ("unfixed", False)):
        experts, report = _experts(t, stream, fix)
        with torch.no_grad():
            w13 = experts._w13(slice(0, experts.count), torch.float32).cpu()
            w2 = experts._w2(slice(0, experts.count), torch.float32).cpu()
            got = experts.forward_static(x.to("hpu"), weights.to("hpu"), ids.to("hpu")).cpu()
        out["runs"][name] = dict(
            w13=w13,
            w2=w2,
            out=got,
            held_dtype=str(experts.w13_weight.dtype),
            held_max=float(experts.w13_weight.cpu().float().abs().max()),
            loaded=len(report.loaded_keys),
        )
    torch.save(out, out_path)
    print("EXPERT_FP8_CARDS_DONE", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
