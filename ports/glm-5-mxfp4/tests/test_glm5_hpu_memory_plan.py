"""The memory plan (``python -m glm5_hpu.memory_plan``): its byte formulas against a real converted
tiny checkpoint, the recipe's figures, the exit codes. The KV page test needs vLLM 0.30.0
(``.venv-cpu030``) and skips without it; the rest runs in the main suite."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from glm5_hpu import memory_plan as mp
from glm5_mxfp4 import convert
from packtests import glm_moe_dsa_tiny

PORT = Path(__file__).resolve().parents[1]
REPO = PORT.parents[1]
RECIPE = REPO / "recipes" / "zai-org" / "GLM-5.3-BF16" / "recipe.yaml"
GIB = 2**30


def run_plan(*args: str, recipe: Path = RECIPE) -> tuple[int, str, dict[str, int]]:
    env = dict(os.environ, PYTHONPATH=str(PORT))
    proc = subprocess.run(
        [sys.executable, "-m", "glm5_hpu.memory_plan", "--recipe", str(recipe), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=REPO,
    )
    rows = {
        m[1].strip(): int(m[2].replace(",", "")) for m in re.finditer(r"^\| (.+?) \| ([-\d,]+) \|", proc.stdout, re.M)
    }
    return proc.returncode, proc.stdout + proc.stderr, rows


def headers(folder: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int]:
    """{name: (dtype, shape)} of every tensor in the folder's shards, and their data bytes (each
    file's size less its 8-byte length and JSON header)."""
    tensors, data = {}, 0
    for f in sorted(folder.glob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        for name, meta in json.loads(raw[8 : 8 + n]).items():
            if name != "__metadata__":
                tensors[name] = (meta["dtype"], tuple(meta["shape"]))
        data += f.stat().st_size - 8 - n
    return tensors, data


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plan")
    src = glm_moe_dsa_tiny.make(str(root / "tiny-bf16"))
    dst = root / "tiny-mxfp4"
    assert convert.main([src, str(dst), "--quiet"]) == 0
    return dst


def test_checkpoint_formula_is_the_converted_files(converted):
    """Every tensor the plan counts is in the converter's output with that dtype and shape, none
    is missing, and the bytes add up to the files' data bytes and the index's total_size."""
    cfg = mp.load_config(converted)
    planned = {t.name: (t.dtype, t.shape) for t in mp.checkpoint_tensors(cfg)}
    found, data = headers(converted)
    assert planned == found
    total = sum(t.nbytes for t in mp.checkpoint_tensors(cfg))
    assert total == data
    assert total == json.loads((converted / "model.safetensors.index.json").read_text())["metadata"]["total_size"]


def test_routed_experts_per_card_add_up_to_the_checkpoint(converted):
    """At TP 4 with GLM_MOE_TP 2 (2 expert groups of 2 cards, each card half the intermediate
    width), the four cards' routed-expert bytes are the checkpoint's U8 bytes exactly; the
    vocabulary split by TP adds up to the embedding and head."""
    cfg = mp.load_config(converted)
    dep = mp.Deployment(
        tp=4,
        ep=True,
        moe_tp=2,
        block_size=128,
        utilization=0.86,
        max_model_len=128,
        max_num_seqs=4,
        mtp_layers=1,
        graph_reserved=0.2,
    )
    card = mp.card_weights(cfg, dep)
    u8 = sum(t.nbytes for t in mp.checkpoint_tensors(cfg) if t.dtype == "U8")
    assert 4 * card["routed experts (MXFP4)"] == u8
    assert 4 * card["embedding + lm_head"] == 2 * cfg.vocab_size * cfg.hidden_size * 2
    with pytest.raises(mp.PlanError, match="do not split"):
        mp.card_weights(cfg, mp.Deployment(**{**dep.__dict__, "tp": 8, "moe_tp": 8}))


def test_seed_figures():
    """The recipe's deployment: TP 8, EP 4 x TP 2, block 128, 0.86, 79 KV layers (78 + MTP) of 576
    bf16 latents, 79 full indexer layers, 312,960 tokens = 2,445 blocks."""
    rc, out, rows = run_plan()
    assert "real config.json was not available" in out
    assert "312,960 tokens = 2,445 blocks (2.39 requests at 131,072)" in out
    assert "experts EP 4 x TP 2 (GLM_MOE_TP)" in out
    assert "(the serving page says 399 GiB)" in out
    ckpt = int(re.search(r"^checkpoint .*: ([\d,]+) bytes", out, re.M)[1].replace(",", ""))
    # 76 MoE layers (75 + MTP) x 256 experts x 3 projections [2048 x 6144] at 4.25 bits; the rest bf16.
    assert 395 * GIB < ckpt < 405 * GIB
    h, inter = 6144, 1024  # GLM_MOE_TP 2: half of moe_intermediate 2048 per card
    mx = (2 * inter * h // 2 + 2 * inter * h // 32) + (h * inter // 2 + h * inter // 32)
    assert rows["routed experts (MXFP4)"] == 76 * 64 * mx
    mla = 79 * 2446 * 128 * 576 * 2
    dsa = 79 * 2446 * 128 * 128 * 2
    assert rows["MLA KV pool (79 layers x (2,445 + 1) blocks x 128 x 576 bf16)"] == mla
    assert rows["DSA indexer-key buffers (79 layers x 128 bf16, after profiling)"] == dsa
    w = rows["weights"]
    parts = (
        "routed experts (MXFP4)",
        "MLA projections",
        "MLA W_UK_T + W_UV (vllm-gaudi)",
        "DSA indexer",
        "shared experts",
        "router",
        "dense MLPs",
        "norms",
        "embedding + lm_head",
        "MTP heads",
    )
    assert w == sum(rows[k] for k in parts)
    budget = rows["budget (gpu_memory_utilization 0.86 x card)"]
    assert budget == int(0.86 * 96 * 10**9)
    assert rows["(a) headroom under the budget: activations, HPU graphs"] == budget - w - mla
    assert rows["(b) headroom on the card: activations, HPU graphs, runtime"] == 96 * 10**9 - w - mla - dsa
    a_ok = budget - w - mla >= 0
    b_ok = 96 * 10**9 - w - mla - dsa >= 0
    assert rc == (0 if a_ok and b_ok else 1), out
    assert f"(a) 312,960 tokens fit inside 0.86 x card with the weights: {'yes' if a_ok else 'NO'}" in out
    assert f"(b) the card holds weights + KV + DSA buffers: {'yes' if b_ok else 'NO'}" in out
    # vllm-gaudi's sizing: pool = free x 0.86 x 0.8 - one page; the implied free memory gives the pool back.
    lo = int(re.search(r"means [\d.]+ to [\d.]+ GiB free after profiling \(([\d,]+) to", out)[1].replace(",", ""))
    page = 79 * 128 * 576 * 2
    assert (int(lo * 0.86 * 0.8) - page) // page == 2445


def test_exit_codes(tmp_path):
    """0 for a pool that fits, 1 at a forced low utilisation, 2 naming the recipe it cannot plan."""
    rc, out, _ = run_plan("--kv-tokens", "131072")
    assert rc == 0 and "verdict: FITS" in out, out
    rc, out, rows = run_plan("--kv-tokens", "131072", "--gpu-memory-utilization", "0.5")
    assert rc == 1 and "verdict: DOES NOT FIT" in out, out
    assert rows["(a) headroom under the budget: activations, HPU graphs"] < 0
    bad = tmp_path / "recipe.yaml"
    bad.write_text("serve:\n  args:\n    - --tensor-parallel-size: 8\n    - --enable-expert-parallel\n")
    rc, out, _ = run_plan(recipe=bad)
    assert rc == 2 and f"{bad}: serve.args has no --block-size" in out, out
    rc, out, _ = run_plan(recipe=tmp_path / "missing.yaml")
    assert rc == 2 and "missing.yaml: cannot read the recipe" in out, out
    cfg_dir = tmp_path / "model"
    cfg_dir.mkdir()
    (cfg_dir / "config.json").write_text('{"model_type": "deepseek_v3"}')
    rc, out, _ = run_plan("--model", str(cfg_dir))
    assert rc == 2 and f"{cfg_dir / 'config.json'}: model_type 'deepseek_v3'" in out, out


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not importable here (run under .venv-cpu030)"
)
def test_kv_page_is_vllms_mla_spec():
    """The plan's page (bytes per block over every KV layer) is vLLM's own MLAAttentionSpec page,
    as vllm-gaudi's get_kv_cache_spec builds it, times the layers."""
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    cfg = mp.glm53_config()
    dep = mp.Deployment(
        tp=8,
        ep=True,
        moe_tp=2,
        block_size=128,
        utilization=0.86,
        max_model_len=131072,
        max_num_seqs=4,
        mtp_layers=1,
        graph_reserved=0.2,
    )
    kv = mp.kv_layout(cfg, dep)
    spec = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=kv.latent, dtype=torch.bfloat16)
    assert kv.page_bytes() == kv.kv_layers * spec.page_size_bytes
    assert kv.latent == 576 and kv.kv_layers == 79 and kv.indexer_layers == 79
