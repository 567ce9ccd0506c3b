"""The router's e_score_correction_bias stays fp32 under a bf16 default dtype, as transformers
keeps it (``_keep_in_fp32_modules_strict``): after construction and after the port's loader.

vLLM builds the model under ``torch.set_default_dtype(model dtype)``; a parameter created without
an explicit dtype is then bf16, and a bias of 1e-3 steps on scores near 0.5 would be rounded to
bf16's 2^-9 spacing before it reorders near-tied experts."""

from __future__ import annotations

import pytest
import torch

from glm5_next_hpu.layers.moe import MoE, Router
from glm5_next_hpu.vllm.loader import load_checkpoint
from glm5_next_hpu.vllm.parallel import Parallel, ParallelMoE

LAYER = 1  # a sparse (MoE) layer of the tiny config


@pytest.fixture()
def bf16_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    yield
    torch.set_default_dtype(old)


@pytest.fixture(scope="module")
def ref_ckpt():
    from packtests.flash_reference import build_reference, checkpoint_tensors

    ref, cfg = build_reference()
    return checkpoint_tensors(ref), cfg


def _under(module: torch.nn.Module) -> torch.nn.Module:
    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.language_model = torch.nn.Module()
    root.model.language_model.layers = torch.nn.ModuleDict({str(LAYER): torch.nn.Module()})
    root.model.language_model.layers[str(LAYER)].mlp = module
    return root


@pytest.mark.parametrize("build", ["router", "moe", "parallel_moe"])
def test_bias_is_fp32_after_build_under_bf16(ref_ckpt, bf16_default, build):
    t = ref_ckpt[1].text_config
    module = {
        "router": lambda: Router(t),
        "moe": lambda: MoE(t).gate,
        "parallel_moe": lambda: ParallelMoE(t, Parallel()).gate,
    }[build]()
    assert module.e_score_correction_bias.dtype == torch.float32
    assert module.weight.dtype == torch.bfloat16  # the router weight follows the model dtype, as in transformers


def test_bias_loaded_exactly_in_fp32(ref_ckpt, bf16_default):
    ckpt, cfg = ref_ckpt
    key = f"model.language_model.layers.{LAYER}.mlp.gate.e_score_correction_bias"
    # A bias whose steps bf16 cannot hold (0.5 + k * 1e-4): an fp32 parameter keeps every one.
    want = 0.5 + 1e-4 * torch.arange(ckpt[key].numel(), dtype=torch.float32)
    assert not torch.equal(want.to(torch.bfloat16).float(), want)  # the case is one bf16 would round
    part = {k: v for k, v in ckpt.items() if k.startswith(f"model.language_model.layers.{LAYER}.mlp.")}
    part[key] = want
    moe = ParallelMoE(cfg.text_config, Parallel())
    report = load_checkpoint(_under(moe), part.items(), cfg.text_config.num_hidden_layers)
    assert key in report.loaded_keys
    bias = moe.gate.e_score_correction_bias
    assert bias.dtype == torch.float32
    assert torch.equal(bias, want)
