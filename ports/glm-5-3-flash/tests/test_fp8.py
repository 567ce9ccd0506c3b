"""Block-FP8 checkpoints: the dequantization (against transformers 5.23.0's own op, bit for bit)
and every refusal of the plugin's loader, in process on toy modules (no vLLM needed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from glm5_next_hpu.vllm.fp8 import (
    FP8_DTYPE,
    BlockFp8Spec,
    Fp8CheckpointError,
    dequantize_block_fp8,
    quantize_block_fp8,
)
from glm5_next_hpu.vllm.loader import CheckpointLoadError, load_checkpoint

QC = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [16, 16],
    "modules_to_not_convert": ["model.router", "model.visual"],
}


def _fp8(rows, cols, block, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 1, cols)  # blocks of very different range
    return quantize_block_fp8(w, block) + (w,)


def _transformers_dequant(q, s, dtype):
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    return Fp8Dequantize(hf_quantizer=None)._dequantize_one(q, s, output_dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,block", [((256, 384), (128, 128)), ((64, 96), (16, 32)), ((48, 64), (16, 16))])
def test_dequantize_is_bit_identical_to_transformers(shape, block, dtype):
    """fp8 -> fp32, times the block's scale_inv in fp32, one rounding to the model dtype: the same
    bits as transformers' Fp8Dequantize (its FP8 integration with dequantize=True)."""
    q, s, _ = _fp8(*shape, block)
    mine = dequantize_block_fp8(q, s, block, dtype)
    ref = _transformers_dequant(q, s, dtype)
    assert mine.dtype == ref.dtype == dtype
    assert torch.equal(mine.view(torch.uint8), ref.view(torch.uint8))


def test_scale_inv_multiplies_per_block():
    q = torch.tensor([[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]).to(FP8_DTYPE)
    s = torch.tensor([[0.5, 3.0]])  # blocks (2 x 2): columns 0-1, then the partial column 2
    out = dequantize_block_fp8(q, s, (2, 2), torch.float32)
    assert out.tolist() == [[1.0, 1.0, 6.0], [1.0, 1.0, 6.0]]


def test_partial_edge_blocks_use_their_blocks_scale():
    q, s, _ = _fp8(40, 50, (16, 16))  # grid 3 x 4, last row/col blocks partial
    assert tuple(s.shape) == (3, 4)
    out = dequantize_block_fp8(q, s, (16, 16), torch.float32)
    for i in range(40):
        for j in range(0, 50, 7):
            assert out[i, j] == q[i, j].float() * s[i // 16, j // 16]


def test_quantize_round_trip_within_e4m3_precision():
    q, s, w = _fp8(64, 64, (16, 16))
    assert q.dtype == FP8_DTYPE and s.dtype == torch.float32
    amax = w.view(4, 16, 4, 16).abs().amax(dim=(1, 3))
    assert torch.allclose(s, amax / 448.0)
    back = dequantize_block_fp8(q, s, (16, 16), torch.float32)
    err = (back - w).abs() / s.repeat_interleave(16, 0).repeat_interleave(16, 1)
    assert float(err.max()) <= 16.0  # half an e4m3 ulp at the top binade (448: ulp 32), in scaled units
    assert not torch.equal(back, w)  # lossy: the tests below can tell dequantized from original weights


@pytest.mark.parametrize(
    "change,match",
    [
        ({"quant_method": "gptq"}, "quant_method"),
        ({"fmt": "e5m2"}, "fmt"),
        ({"activation_scheme": "static"}, "activation_scheme"),
        ({"weight_block_size": [128]}, "weight_block_size"),
        ({"weight_block_size": None}, "weight_block_size"),
        ({"scale_fmt": "ue8m0"}, "scale_fmt"),
        ({"modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
    ],
)
def test_quantization_config_refusals(change, match):
    with pytest.raises(Fp8CheckpointError, match=match):
        BlockFp8Spec.from_quantization_config({**QC, **change})


def test_modules_to_not_convert_matches_as_transformers_does():
    from transformers.quantizers.quantizers_utils import should_convert_module

    spec = BlockFp8Spec.from_quantization_config(
        {**QC, "modules_to_not_convert": ["model.layers.1", "mlp.gate", "lm_head"]}
    )
    for name in (
        "model.layers.1.attn",
        "model.layers.11.attn",
        "x.mlp.gate",
        "x.mlp.gate_proj",
        "lm_head",
        "model.layers.10",
    ):
        assert spec.skipped(name) == (not should_convert_module(name, list(spec.modules_to_not_convert))), name


# ----------------------------------------------------------------------------- the loader


class _Toy(nn.Module):
    """Parameters named like checkpoint keys: two projections, a router kept BF16, stacked experts."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.model = nn.Module()
        self.model.proj = nn.Linear(32, 48, bias=False, dtype=dtype)
        self.model.router = nn.Linear(32, 4, bias=False, dtype=dtype)
        self.model.mlp = nn.Module()
        self.model.mlp.experts = nn.Module()
        self.model.mlp.experts.w13_weight = nn.Parameter(torch.empty(2, 32, 32, dtype=dtype), requires_grad=False)
        self.model.mlp.experts.w2_weight = nn.Parameter(torch.empty(2, 32, 16, dtype=dtype), requires_grad=False)


def _toy_checkpoint(block=(16, 16)):
    """(stream, originals): FP8 projections and experts with scales, the router in BF16."""
    g = torch.Generator().manual_seed(1)
    dense = {"model.proj.weight": torch.randn(48, 32, generator=g)}
    for e in range(2):
        for p, shape in (("gate_proj", (16, 32)), ("up_proj", (16, 32)), ("down_proj", (32, 16))):
            dense[f"model.mlp.experts.{e}.{p}.weight"] = torch.randn(*shape, generator=g)
    stream = {}
    for k, w in dense.items():
        q, s = quantize_block_fp8(w, block)
        stream[k], stream[k + "_scale_inv"] = q, s
    stream["model.router.weight"] = torch.randn(4, 32, generator=g).to(torch.bfloat16)
    return stream, dense


def _load(stream, spec, dtype=torch.float32, order=None):
    model = _Toy(dtype)
    items = list(stream.items()) if order is None else [(k, stream[k]) for k in order]
    return model, load_checkpoint(model, items, num_hidden_layers=1, fp8=spec)


SPEC = BlockFp8Spec.from_quantization_config(QC)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scales_first", [False, True])
def test_loader_dequantizes_every_fp8_weight_with_its_scale(dtype, scales_first):
    stream, dense = _toy_checkpoint()
    order = sorted(stream, key=lambda k: (not k.endswith("_scale_inv")) if scales_first else k.endswith("_scale_inv"))
    model, report = _load(stream, SPEC, dtype, order)
    fp8_keys = sorted(k for k in stream if stream[k].dtype == FP8_DTYPE)
    assert sorted(report.fp8_dequantized) == fp8_keys and len(fp8_keys) == 7
    assert report.loaded_keys == set(dense) | {"model.router.weight"}  # scales consumed by their weights
    want = lambda k: _transformers_dequant(stream[k], stream[k + "_scale_inv"], dtype)  # noqa: E731
    assert torch.equal(model.model.proj.weight, want("model.proj.weight"))
    w13 = model.model.mlp.experts.w13_weight
    assert torch.equal(w13[1, :16], want("model.mlp.experts.1.gate_proj.weight"))
    assert torch.equal(w13[1, 16:], want("model.mlp.experts.1.up_proj.weight"))
    assert torch.equal(model.model.mlp.experts.w2_weight[0], want("model.mlp.experts.0.down_proj.weight"))
    assert not torch.equal(model.model.proj.weight, dense["model.proj.weight"].to(dtype))


def _refusal(stream, spec=SPEC):
    with pytest.raises((Fp8CheckpointError, CheckpointLoadError)) as info:
        _load(stream, spec)
    return str(info.value)


def test_missing_scale_is_refused_naming_the_weight():
    stream, _ = _toy_checkpoint()
    del stream["model.mlp.experts.1.up_proj.weight_scale_inv"]
    msg = _refusal(stream)
    assert "model.mlp.experts.1.up_proj.weight: FP8 weight without its scale" in msg


def test_extra_scale_is_refused_naming_it():
    stream, _ = _toy_checkpoint()
    stream["model.router.weight_scale_inv"] = torch.ones(1, 2)  # the router is BF16: a scale for it is extra
    msg = _refusal(stream)
    assert "model.router.weight_scale_inv: scale without an FP8 weight" in msg


def test_duplicate_scale_is_refused():
    stream, _ = _toy_checkpoint()
    items = list(stream.items()) + [("model.proj.weight_scale_inv", stream["model.proj.weight_scale_inv"])]
    with pytest.raises(Fp8CheckpointError, match=r"model\.proj\.weight_scale_inv: scale appears twice"):
        load_checkpoint(_Toy(), items, num_hidden_layers=1, fp8=SPEC)


@pytest.mark.parametrize("shape", [(3, 1), (3, 3), (2, 2), (4, 2)])
def test_scale_off_the_block_grid_is_refused(shape):
    stream, _ = _toy_checkpoint()
    stream["model.proj.weight_scale_inv"] = torch.ones(*shape)  # grid of (48, 32) in 16 x 16 blocks: (3, 2)
    msg = _refusal(stream)
    assert "model.proj.weight_scale_inv: shape" in msg and "block grid (3, 2)" in msg


def test_scale_grid_follows_the_configs_block_size():
    stream, _ = _toy_checkpoint(block=(16, 16))
    msg = _refusal(stream, BlockFp8Spec.from_quantization_config({**QC, "weight_block_size": [16, 32]}))
    assert "block grid (3, 1)" in msg


def test_fp8_tensor_of_a_module_not_to_convert_is_refused():
    stream, _ = _toy_checkpoint()
    q, s = quantize_block_fp8(stream["model.router.weight"].float(), (16, 16))
    stream["model.router.weight"], stream["model.router.weight_scale_inv"] = q, s
    msg = _refusal(stream)
    assert (
        "model.router.weight: stored as torch.float8_e4m3fn but model.router is in quantization_config.modules_to_not_convert"
        in msg
    )


def test_fp8_tensors_without_a_quantization_config_are_refused():
    stream, _ = _toy_checkpoint()
    msg = _refusal(stream, spec=None)
    assert "no fp8 quantization_config" in msg


def test_fp8_non_weight_tensor_is_refused():
    stream, _ = _toy_checkpoint()
    stream["model.proj.bias"] = torch.zeros(48).to(FP8_DTYPE)
    assert "model.proj.bias" in _refusal(stream)


def test_fp8_parameter_takes_the_raw_bytes_and_its_scale_parameter_the_scale():
    """A parameter vLLM's FP8 method made FP8 gets the checkpoint's e4m3 bytes, not a dequantized
    weight, and the scale goes to the ``weight_scale_inv`` parameter beside it, bit for bit."""
    stream, _ = _toy_checkpoint()
    model = _Toy()
    model.model.proj.weight = nn.Parameter(torch.empty(48, 32, dtype=FP8_DTYPE), requires_grad=False)
    model.model.proj.weight_scale_inv = nn.Parameter(torch.empty(3, 2), requires_grad=False)
    report = load_checkpoint(model, list(stream.items()), num_hidden_layers=1, fp8=SPEC)
    assert report.fp8_raw == ["model.proj.weight"] and "model.proj.weight" not in report.fp8_dequantized
    assert {"model.proj.weight", "model.proj.weight_scale_inv"} <= report.loaded_keys
    assert torch.equal(model.model.proj.weight.view(torch.uint8), stream["model.proj.weight"].view(torch.uint8))
    assert torch.equal(model.model.proj.weight_scale_inv, stream["model.proj.weight_scale_inv"])


def test_fp8_parameter_without_a_scale_parameter_is_refused():
    stream, _ = _toy_checkpoint()
    model = _Toy()
    model.model.proj.weight = nn.Parameter(torch.empty(48, 32, dtype=FP8_DTYPE), requires_grad=False)
    with pytest.raises(
        CheckpointLoadError, match=r"model\.proj\.weight_scale_inv: no parameter 'model\.proj\.weight_scale_inv'"
    ):
        load_checkpoint(model, list(stream.items()), num_hidden_layers=1, fp8=SPEC)


def test_unquantized_checkpoint_still_loads_without_a_spec():
    _, dense = _toy_checkpoint()
    stream = {**dense, "model.router.weight": torch.zeros(4, 32)}
    model, report = _load(stream, None)
    assert report.fp8_dequantized == [] and torch.equal(model.model.proj.weight, dense["model.proj.weight"])
