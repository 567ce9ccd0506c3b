"""Checks against vLLM 0.30.0's own code, run in a process of its own.

    python vllm030_check.py VLLM_TREE DST   -> one JSON object on stdout

VLLM_TREE is the vLLM 0.30.0 wheel's package tree (fixpack's release-source cache, every file
checked against the wheel's RECORD); the test puts it first on PYTHONPATH, then the port folder
(glm5_mxfp4) and the repository root (packtests.mxfp4_blocks), so `vllm` is 0.30.0 here and nowhere
else in the test session. What runs is vLLM's code:
  * `upcast_from_mxfp_torch` (triton_kernels numerics, pure torch) dequantizes our blocks;
  * `RoutedExperts.build_expert_params_mapping` maps every routed-expert key of DST to the
    parameter vLLM loads it into (the mapping DeepseekV2/GlmMoeDsa's load_weights uses);
  * `Mxfp4MoEMethod.create_weights` creates those parameters for the layer's FusedMoEConfig.
    `Mxfp4MoEMethod.__init__` is skipped: it only selects a GPU kernel backend and refuses CPU
    ("No MXFP4 MoE backend supports the deployment configuration"), so the loading path itself
    cannot run here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys


def main(tree: str, dst: str) -> dict:
    import numpy as np
    import torch
    import vllm
    from safetensors import safe_open
    from vllm.model_executor.layers.fused_moe import config as C
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod
    from vllm.third_party.triton_kernels.numerics_details.mxfp import upcast_from_mxfp_torch

    from glm5_mxfp4 import mxfp4
    from packtests import mxfp4_blocks

    out: dict = {"vllm_file": vllm.__file__}
    # 1. dequantization
    x = mxfp4_blocks.all_blocks()
    deq = {}
    for mode in mxfp4.SCALE_MODES:
        q, s = mxfp4.quantize(x, mode)
        ours = mxfp4.dequantize(q, s)
        theirs = upcast_from_mxfp_torch(torch.from_numpy(q), torch.from_numpy(s), torch.float32, -1).numpy()
        code0 = np.repeat(s == 0, 32, axis=-1)
        same = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
        deq[mode] = {
            "elements": int(ours.size),
            "code0_elements": int(code0.sum()),
            "equal_outside_code0": bool(same[~code0].all()),
            "vllm_code0_is_zero": bool((theirs[code0] == 0).all()),
        }
    out["dequant"] = deq
    # 2. the converted checkpoint, key by key
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(dst, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    E, H, inter = cfg["n_routed_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    mapping = RoutedExperts.build_expert_params_mapping("gate_proj", "down_proj", "up_proj", num_experts=E)
    fields = {f.name for f in dataclasses.fields(C.FusedMoEParallelConfig)}
    pc = C.FusedMoEParallelConfig(
        **{
            n: (1 if n.endswith("_size") else 0 if n.endswith("_rank") else False)
            for n in fields
            if n != "all2all_backend"
        },
        all2all_backend="naive",
    )
    moe = C.FusedMoEConfig(
        num_experts=E,
        experts_per_token=cfg["num_experts_per_tok"],
        hidden_dim=H,
        intermediate_size=inter,
        num_local_experts=E,
        num_logical_experts=E,
        activation=MoEActivation.SILU,
        device="cpu",
        routing_method=C.RoutingMethodType.DeepSeekV3,
        moe_parallel_config=pc,
        in_dtype=torch.bfloat16,
        intermediate_size_per_partition=inter,
    )
    method = Mxfp4MoEMethod.__new__(Mxfp4MoEMethod)
    method.moe = moe
    layers: dict[str, torch.nn.Module] = {}
    problems: list[str] = []
    loaded = 0
    readers: dict[str, object] = {}
    for key in sorted(weight_map):
        if ".mlp.experts." not in key or ".shared_experts." in key:
            continue
        hits = [m for m in mapping if m[1] in key]
        if len(hits) != 1:
            problems.append(f"{key}: {len(hits)} mapping entries")
            continue
        param_name, weight_name, expert_id, shard_id = hits[0]
        mapped = key.replace(weight_name, param_name)
        prefix, pname = mapped.split(".mlp.experts.", 1)
        layer = layers.get(prefix)
        if layer is None:
            layer = layers[prefix] = torch.nn.Module()
            method.create_weights(
                layer,
                num_experts=E,
                hidden_size=H,
                intermediate_size_per_partition=inter,
                params_dtype=torch.bfloat16,
                weight_loader=lambda *a, **k: None,
            )
        attr = pname.split(".")[-1]  # routed_experts.w13_weight -> w13_weight
        param = getattr(layer, attr, None)
        if param is None:
            problems.append(f"{key}: maps to {mapped}, which create_weights does not make")
            continue
        shard = weight_map[key]
        f = readers.get(shard) or readers.setdefault(shard, safe_open(os.path.join(dst, shard), "pt"))
        t = f.get_tensor(key)
        # what the stock loader does at TP 1 (_load_w13 / _load_w2): w1 the first half of the rows, w3 the second
        dest = param.data[expert_id]
        if shard_id in ("w1", "w3"):
            half = dest.shape[0] // 2
            dest = dest[:half] if shard_id == "w1" else dest[half:]
        if t.dtype != param.dtype or tuple(t.shape) != tuple(dest.shape):
            problems.append(f"{key}: {t.dtype}{list(t.shape)} but {mapped} expects {param.dtype}{list(dest.shape)}")
            continue
        dest.copy_(t)
        loaded += 1
    # every parameter slot filled: each layer's w13/w2 weight and scale hold no unwritten expert
    params = {}
    for prefix, layer in layers.items():
        for name, p in layer.named_parameters():
            params[f"{prefix}.{name}"] = [str(p.dtype), list(p.shape)]
    out.update({"mapped_and_copied": loaded, "problems": problems, "params": params, "moe_layers": sorted(layers)})
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
