"""The memory plan (``python -m glm5_next_hpu.memory_plan``) on the GLM-5.3-Flash recipe.

Needs vLLM 0.26.0 (run under .venv-cpu: tests/e2e/run.sh runs this file). Each plan runs in its
own interpreter, as the command does (it sets up vLLM's single-process distributed state).
The checks against the config's own numbers below are independent of the plan's code path: the
plan counts the plugin's built parameters, these multiply the config's sizes."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PORT_DIR = Path(__file__).resolve().parents[1]
REPO = PORT_DIR.parents[1]
RECIPE = REPO / "recipes" / "zai-org" / "GLM-5.3-Flash" / "recipe.yaml"
GIB = 2**30

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not importable here (run under .venv-cpu)"
)

# The real model (transformers 5.23.0 defaults): 42 MoE layers, 288 experts of 2048, hidden 4096.
MOE_LAYERS, EXPERTS, D, INTER, TP = 42, 288, 4096, 2048, 8


def run_plan(*args: str) -> tuple[int, str, dict[str, int]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PORT_DIR), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "glm5_next_hpu.memory_plan", "--recipe", str(RECIPE), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=REPO,
    )
    rows = {
        m[1].strip(): int(m[2].replace(",", "")) for m in re.finditer(r"^\| (.+?) \| ([-\d,]+) \|", proc.stdout, re.M)
    }
    return proc.returncode, proc.stdout + proc.stderr[-3000:], rows


def fp8(rows: int, cols: int) -> int:
    return rows * cols + 4 * math.ceil(rows / 128) * math.ceil(cols / 128)


@pytest.fixture(scope="module")
def fp8_plan():
    return run_plan("--experts", "fp8")


def test_seed_recipe_fits_with_fp8_experts(fp8_plan):
    rc, out, rows = fp8_plan
    assert rc == 0, out
    assert "KV block 640 tokens x 1280 blocks = 819,200 tokens" in out
    assert "verdict: FITS" in out
    # 36 whole experts per rank (EP 8) in each of 42 MoE layers: w13 [4096, 4096] and w2 [4096, 2048] in block FP8.
    assert rows["routed experts (fp8)"] == MOE_LAYERS * (EXPERTS // TP) * (fp8(2 * INTER, D) + fp8(D, INTER))
    # vllm-gaudi's hybrid path with the port's patches: per MLA layer a latent (key) tensor of
    # (1280 * 640/128 + 1) * 128 rows x 512, bf16, and no value tensor (hybrid-mla-no-value-cache).
    per_layer = (1280 * 640 // 128 + 1) * 128 * 512 * 2
    assert rows["MLA latent cache"] == 11 * per_layer
    assert not any(k.startswith("MLA value cache") for k in rows)
    assert (
        f"hybrid-mla-no-value-cache (applied by install.sh) leaves out the MLA value cache the release allocates and never reads: {11 * per_layer:,} bytes"
        in out
    )
    # Compact KDA state: (32 seqs x 4 GDN groups + 2) slots x (conv 3*1024 x 3 bf16 + 8 x 128 x 128 fp32) per shared tensor.
    per_slot = 3 * 1024 * 3 * 2 + 8 * 128 * 128 * 4
    assert rows["KDA state (compact)"] % ((32 * 4 + 2) * per_slot) == 0
    total = rows["total allocated"]
    parts = (
        "KDA layers",
        "MLA layers",
        "MLA W_UK_T + W_UV (vllm-gaudi)",
        "MoE shared experts + router",
        "dense MLPs",
        "mHC",
        "norms",
        "vision tower",
        "embedding + lm_head",
    )
    assert rows["other weights"] == sum(rows[k] for k in parts)
    kv = rows["MLA latent cache"] + rows["KDA state (compact)"]
    assert total == rows["routed experts (fp8)"] + rows["other weights"] + kv
    assert rows["budget (gpu_memory_utilization 0.82 x card)"] == int(0.82 * 96 * 10**9)
    assert rows["activation and graph headroom left"] == rows["budget (gpu_memory_utilization 0.82 x card)"] - total > 0


def test_bf16_experts_do_not_fit(fp8_plan):
    rc, out, rows = run_plan("--experts", "bf16")
    assert rc == 1, out
    assert "verdict: DOES NOT FIT" in out
    assert rows["routed experts (bf16)"] == MOE_LAYERS * (EXPERTS // TP) * (2 * INTER * D + D * INTER) * 2
    assert rows["routed experts (bf16)"] / GIB > 70
    assert rows["activation and graph headroom left"] < 0
    # Everything but the experts is the same plan.
    fp8_rows = fp8_plan[2]
    assert rows["other weights"] == fp8_rows["other weights"]
    assert rows["MLA latent cache"] == fp8_rows["MLA latent cache"]


def test_release_kv_counts_the_unread_value_cache(fp8_plan):
    """--release-kv: the KV as the pristine release allocates it (a value tensor per MLA layer, the
    latent's size): the saving of hybrid-mla-no-value-cache is exactly that row, and the recipe's
    recipe still fits without the patch."""
    rc, out, rows = run_plan("--experts", "fp8", "--release-kv")
    fp8_rows = fp8_plan[2]
    value = rows["MLA value cache (release without hybrid-mla-no-value-cache: allocated, never read)"]
    assert value == rows["MLA latent cache"] == fp8_rows["MLA latent cache"]
    assert rows["total allocated"] == fp8_rows["total allocated"] + value
    assert rows["activation and graph headroom left"] == fp8_rows["activation and graph headroom left"] - value
    assert rc == 0 and "counted above (--release-kv)" in out, out


def test_a_recipe_without_tensor_parallel_size_is_refused(tmp_path):
    bad = tmp_path / "recipe.yaml"
    bad.write_text("serve:\n  args:\n    - --dtype: bfloat16\n")
    env = dict(os.environ, PYTHONPATH=str(PORT_DIR))
    proc = subprocess.run(
        [sys.executable, "-m", "glm5_next_hpu.memory_plan", "--recipe", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2 and "no --tensor-parallel-size" in proc.stderr


def test_at_rest_dtype_rule_on_named_parameters():
    """Only the language model's make_linear projections are block FP8 (and not those in
    modules_to_not_convert); the vision tower's MLP of the same name stays in the model dtype."""
    import torch

    from glm5_next_hpu.memory_plan import fp8_at_rest, weight_bytes

    def lin(o, i):
        return torch.nn.Linear(i, o, bias=False, dtype=torch.bfloat16)

    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.visual = torch.nn.Module()
    root.model.visual.mlp = torch.nn.Module()
    root.model.visual.mlp.gate_proj = lin(256, 128)
    root.model.language_model = torch.nn.Module()
    layer = torch.nn.Module()
    layer.mlp = torch.nn.Module()
    layer.mlp.gate_proj = lin(256, 128)
    layer.mlp.up_proj = lin(256, 128)
    root.model.language_model.layers = torch.nn.ModuleList([layer])
    skipped = ["model.language_model.layers.0.mlp.up_proj"]
    got = weight_bytes(root, skipped, "fp8", 2)
    assert got["vision tower"] == 256 * 128 * 2
    assert got["dense MLPs"] == fp8_at_rest((256, 128)) + 256 * 128 * 2
    assert weight_bytes(root, None, "fp8", 2)["dense MLPs"] == 2 * 256 * 128 * 2  # no FP8 checkpoint


def test_fp8_experts_are_counted_once_at_their_own_size():
    """The model holds a block-FP8 checkpoint's experts as e4m3 parameters beside fp32 block scales:
    both count as routed experts, at their size, and nothing of them elsewhere (the scales were once
    counted a second time among the dense MLPs); with --experts bf16 the weights count in the model
    dtype and the scales not at all."""
    import torch

    from glm5_next_hpu.memory_plan import weight_bytes

    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.language_model = torch.nn.Module()
    layer = torch.nn.Module()
    layer.mlp = torch.nn.Module()
    layer.mlp.experts = torch.nn.Module()
    e = layer.mlp.experts
    e.w13_weight = torch.nn.Parameter(torch.zeros(4, 512, 256, dtype=torch.float8_e4m3fn), requires_grad=False)
    e.w2_weight = torch.nn.Parameter(torch.zeros(4, 256, 256, dtype=torch.float8_e4m3fn), requires_grad=False)
    e.w13_weight_scale_inv = torch.nn.Parameter(torch.zeros(4, 4, 2))
    e.w2_weight_scale_inv = torch.nn.Parameter(torch.zeros(4, 2, 2))
    root.model.language_model.layers = torch.nn.ModuleList([layer])
    got = weight_bytes(root, [], "fp8", 2)
    assert got["routed experts"] == 4 * (512 * 256 + 256 * 256) + 4 * 4 * (4 * 2 + 2 * 2)
    assert sum(v for k, v in got.items() if k != "routed experts") == 0
    bf16 = weight_bytes(root, [], "bf16", 2)
    assert bf16["routed experts"] == 4 * (512 * 256 + 256 * 256) * 2
