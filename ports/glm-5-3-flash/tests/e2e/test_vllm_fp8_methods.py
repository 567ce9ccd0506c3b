"""The HPU path's FP8 loading, on CPU: vLLM 0.26.0's own ``Fp8Config`` builds the port's projections
with vLLM's ``Fp8LinearMethod`` and the loader puts the checkpoint's FP8 bytes and block scales into
vLLM's FP8 parameters, each exactly once, per rank (TP 1, and both ranks of TP 2 in one process).

What is real: ``Fp8Config.from_config`` on the tiny block-FP8 checkpoint's quantization_config
(``checkpoint.build_fp8``, 16 x 16 blocks), its ``get_quant_method``, ``Fp8LinearMethod`` and its
``create_weights`` (vLLM's ``ModelWeightParameter`` / ``BlockQuantScaleParameter``, its block-shape
check), the port's layers and loader, and a one-process vLLM TP group (the parameters ask it for
their rank). What stands in for the device: the FP8 GEMM kernel. vLLM picks one when it builds the
method; on this CPU its only candidate needs AMX (``test_vllm_cpu_fp8.py`` records the refusal),
so this module lists a selection-only kernel for the CPU platform, as vllm-gaudi lists its own
selection-only kernel for HPU (whose ``Fp8LinearMethod.apply`` runs the HPU ops instead). Its GEMM
raises: no FP8 forward runs here -- that needs a card (device gate ``fp8``, not measured).
"""

from __future__ import annotations

import importlib.util
import json
import socket
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not importable in this interpreter (run under .venv-cpu: tests/e2e/run.sh)", allow_module_level=True
    )

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from packtests import flash_checkpoint as ck  # noqa: E402

LAYERS = "model.language_model.layers"
TP = 2
ROW = ("o_proj", "down_proj")  # row-parallel: the weight's columns and the scale's block columns split
REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa")
FP8 = torch.float8_e4m3fn


def _selection_only_kernel():
    from vllm.model_executor.kernels.linear.scaled_mm.BlockScaledMMLinearKernel import Fp8BlockScaledMMLinearKernel

    class SelectionOnlyFp8BlockKernel(Fp8BlockScaledMMLinearKernel):
        @classmethod
        def is_supported(cls, compute_capability=None):
            return True, None

        @classmethod
        def can_implement(cls, config):
            return True, None

        def apply_block_scaled_mm(self, A, B, As, Bs):
            raise NotImplementedError("no FP8 GEMM on this machine: the FP8 forward needs a card")

    return SelectionOnlyFp8BlockKernel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory):
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("glm5_next_fp8_methods")
    _, cfg = ck.build(root / "bf16")
    qc = ck.build_fp8(root / "bf16", root / "fp8", cfg)
    assert json.loads((root / "fp8" / "config.json").read_text())["quantization_config"] == qc
    return load_file(str(root / "fp8" / "model.safetensors")), qc, cfg.text_config


@pytest.fixture(scope="module")
def vllm_fp8(fp8_ckpt):
    """vLLM's Fp8Config from the checkpoint's quantization_config, current, with a one-rank TP group."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.model_executor.kernels import linear as kernels
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.platforms import current_platform

    vc = VllmConfig()
    object.__setattr__(vc, "model_config", SimpleNamespace(dtype=torch.bfloat16, is_moe=True, is_mm_prefix_lm=False))
    object.__setattr__(vc, "quant_config", Fp8Config.from_config(fp8_ckpt[1]))
    with pytest.MonkeyPatch.context() as mp, set_current_vllm_config(vc):
        mp.setitem(kernels._POSSIBLE_FP8_BLOCK_KERNELS, current_platform._enum, [_selection_only_kernel()])
        created = not ps.model_parallel_is_initialized()
        if created:
            ps.init_distributed_environment(1, 0, f"tcp://127.0.0.1:{_free_port()}", 0, "gloo")
            ps.initialize_model_parallel(1, 1)
        try:
            yield vc
        finally:
            if created:
                ps.destroy_model_parallel()
                ps.destroy_distributed_environment()


def _rooted(prefix: str, module: nn.Module) -> nn.Module:
    """``module`` at ``prefix``, so that its parameter names are the checkpoint's keys."""
    root = node = nn.Module()
    *parents, last = prefix.split(".")
    for name in parents:
        child = nn.Module()
        node.add_module(name, child)
        node = child
    node.add_module(last, module)
    return root


def _build(vc, t, layer: int, sub: str, rank: int, size: int) -> nn.Module:
    from glm5_next_hpu.vllm.fp8_config import checkpoint_fp8_spec, layer_quant_config
    from glm5_next_hpu.vllm.model import Glm5NextMLA
    from glm5_next_hpu.vllm.parallel import Parallel, decoder_mlp

    par = Parallel(rank, size)
    prefix = f"{LAYERS}.{layer}.{sub}"
    vc.compilation_config.static_forward_context.clear()  # the same attention layer is built per rank
    if sub == "self_attn":
        return Glm5NextMLA(t, vc, prefix, par)
    # as the model builds it: the checkpoint's block-FP8 spec keeps the routed experts in FP8 at rest
    return decoder_mlp(t, layer, par, layer_quant_config(vc.quant_config), prefix, checkpoint_fp8_spec(vc.quant_config))


def _load(vc, ckpt, t, layer, sub, rank, size, items=None):
    from glm5_next_hpu.vllm.fp8_config import checkpoint_fp8_spec
    from glm5_next_hpu.vllm.loader import load_checkpoint

    prefix = f"{LAYERS}.{layer}.{sub}"
    module = _build(vc, t, layer, sub, rank, size)
    if items is None:
        items = [(k, v) for k, v in ckpt.items() if k.startswith(prefix + ".")]
    report = load_checkpoint(
        _rooted(prefix, module),
        items,
        t.num_hidden_layers,
        tp_rank=rank,
        tp_size=size,
        fp8=checkpoint_fp8_spec(vc.quant_config),
    )
    return module, report, dict(items)


def _rank_slice(key: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's part of a checkpoint weight or scale, by the layer's kind (vLLM's split)."""
    module = key.removesuffix("_scale_inv").removesuffix(".weight").rsplit(".", 1)[-1]
    if size == 1 or module in REPLICATED:
        return tensor
    return tensor.chunk(size, dim=1 if module in ROW else 0)[rank]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


# (layer, sub): MLA of layer 1 (MoE layer), dense MLP of layer 0, MoE (shared expert) of layer 1
CASES = [(1, "self_attn"), (0, "mlp"), (1, "mlp")]
RANKS = [(0, 1), (0, TP), (1, TP)]


@pytest.mark.parametrize("layer,sub", CASES, ids=["mla", "dense-mlp", "moe"])
@pytest.mark.parametrize("rank,size", RANKS, ids=["tp1", "tp2-rank0", "tp2-rank1"])
def test_fp8_config_builds_vllm_fp8_parameters_of_the_ranks_shape(vllm_fp8, fp8_ckpt, layer, sub, rank, size):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod
    from vllm.model_executor.parameter import BlockQuantScaleParameter, ModelWeightParameter

    ckpt, qc, t = fp8_ckpt
    block = qc["weight_block_size"]
    module = _build(vllm_fp8, t, layer, sub, rank, size)
    prefix = f"{LAYERS}.{layer}.{sub}"
    seen_fp8, seen_plain = set(), set()
    for name, sub_module in module.named_modules():
        method = getattr(sub_module, "quant_method", None)
        if method is None or not name:
            continue
        key = f"{prefix}.{name}.weight"
        if ckpt[key].dtype == FP8:
            assert type(method) is Fp8LinearMethod, name
            w, s = sub_module.weight, sub_module.weight_scale_inv
            assert isinstance(w, ModelWeightParameter) and isinstance(s, BlockQuantScaleParameter), name
            want = tuple(_rank_slice(key, ckpt[key], rank, size).shape)
            assert (w.dtype, tuple(w.shape)) == (FP8, want), name
            assert (s.dtype, tuple(s.shape)) == (torch.float32, (-(-want[0] // block[0]), -(-want[1] // block[1]))), (
                name
            )
            seen_fp8.add(name)
        else:  # stored BF16 and listed in modules_to_not_convert: vLLM's unquantized method
            assert type(method) is UnquantizedLinearMethod and sub_module.weight.dtype != FP8, name
            seen_plain.add(name)
    if sub == "self_attn":
        assert seen_fp8 == {"q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "o_proj"} and seen_plain == {"kv_b_proj"}
        # the indexer is the port's (loaded, skipped): its FP8 weights land dequantized
        assert module.indexer.wk.weight.dtype == torch.float32
    elif layer == 0:
        assert seen_fp8 == {"gate_proj", "up_proj", "down_proj"}
    else:
        assert seen_fp8 == {f"shared_experts.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
        # routed experts: the port's loop (the clamp), holding the FP8 bytes and fp32 block scales
        assert module.experts.w13_weight.dtype == FP8 and module.experts.w2_weight_scale_inv.dtype == torch.float32


@pytest.mark.parametrize("layer,sub", CASES, ids=["mla", "dense-mlp", "moe"])
@pytest.mark.parametrize("rank,size", RANKS, ids=["tp1", "tp2-rank0", "tp2-rank1"])
def test_every_fp8_tensor_and_scale_lands_once_with_the_checkpoints_bytes(vllm_fp8, fp8_ckpt, layer, sub, rank, size):
    from glm5_next_hpu.vllm.quant_linear import Glm5NextQuantLinear

    ckpt, _, t = fp8_ckpt
    module, report, part = _load(vllm_fp8, ckpt, t, layer, sub, rank, size)
    prefix = f"{LAYERS}.{layer}.{sub}"
    params = dict(_rooted(prefix, module).named_parameters())
    fp8_linears = {
        f"{prefix}.{n}.weight"
        for n, m in module.named_modules()
        if isinstance(m, Glm5NextQuantLinear) and m.weight.dtype == FP8
    }
    fp8_keys = {k for k, v in part.items() if v.dtype == FP8}
    assert fp8_linears and fp8_linears <= fp8_keys
    experts = {k for k in fp8_keys if ".mlp.experts." in k}  # raw into the stacked experts (test_tensor_parallel)
    assert bool(experts) == (sub == "mlp" and layer != 0)
    raw = fp8_linears | experts
    assert sorted(report.fp8_raw) == sorted(raw) and len(set(report.fp8_raw)) == len(report.fp8_raw)
    assert sorted(report.fp8_dequantized) == sorted(fp8_keys - raw)
    raw_scales = {k + "_scale_inv" for k in fp8_linears}
    other_scales = {k + "_scale_inv" for k in fp8_keys - raw}
    assert report.loaded_keys == set(part) - other_scales  # the raw scales are loaded keys of their own
    assert not report.skipped_keys
    for key in sorted(fp8_linears | raw_scales):
        want = _rank_slice(key, part[key], rank, size)
        assert _same_bytes(params[key].data, want), key
    if size == TP:  # the two ranks together hold the whole tensor: each byte on exactly one rank
        other, _, _ = _load(vllm_fp8, ckpt, t, layer, sub, 1 - rank, size)
        other_params = dict(_rooted(prefix, other).named_parameters())
        for key in sorted(fp8_linears | raw_scales):
            module_name = key.removesuffix("_scale_inv").removesuffix(".weight").rsplit(".", 1)[-1]
            if module_name in REPLICATED:
                assert _same_bytes(params[key].data, other_params[key].data), key
                continue
            dim = 1 if module_name in ROW else 0
            halves = [params[key].data, other_params[key].data][:: 1 if rank == 0 else -1]
            assert _same_bytes(torch.cat(halves, dim=dim), part[key]), key


def _mlp_items(ckpt, layer=0):
    return {k: v for k, v in ckpt.items() if k.startswith(f"{LAYERS}.{layer}.mlp.")}


def test_missing_scale_is_refused_on_the_fp8_method_path(vllm_fp8, fp8_ckpt):
    from glm5_next_hpu.vllm.fp8 import Fp8CheckpointError

    ckpt, _, t = fp8_ckpt
    items = _mlp_items(ckpt)
    del items[f"{LAYERS}.0.mlp.up_proj.weight_scale_inv"]
    with pytest.raises(Fp8CheckpointError, match=rf"{LAYERS}\.0\.mlp\.up_proj\.weight: FP8 weight without its scale"):
        _load(vllm_fp8, ckpt, t, 0, "mlp", 1, TP, list(items.items()))


def test_extra_scale_is_refused_on_the_fp8_method_path(vllm_fp8, fp8_ckpt):
    from glm5_next_hpu.vllm.fp8 import Fp8CheckpointError

    ckpt, _, t = fp8_ckpt
    items = _mlp_items(ckpt, 1)
    items[f"{LAYERS}.1.mlp.gate.weight_scale_inv"] = torch.ones(1, 4)  # the router is BF16
    with pytest.raises(Fp8CheckpointError, match=r"mlp\.gate\.weight_scale_inv: scale without an FP8 weight"):
        _load(vllm_fp8, ckpt, t, 1, "mlp", 0, TP, list(items.items()))


@pytest.mark.parametrize("grid", [(8, 9), (4, 4), (9, 8)])
def test_scale_off_the_block_grid_is_refused_on_the_fp8_method_path(vllm_fp8, fp8_ckpt, grid):
    from glm5_next_hpu.vllm.fp8 import Fp8CheckpointError

    ckpt, _, t = fp8_ckpt
    items = _mlp_items(ckpt)
    key = f"{LAYERS}.0.mlp.down_proj.weight_scale_inv"
    assert tuple(items[key].shape) == (4, 8)  # down_proj [64, 128] in 16 x 16 blocks
    items[key] = torch.ones(grid)
    with pytest.raises(
        Fp8CheckpointError, match=r"down_proj\.weight_scale_inv: shape .* does not match the block grid \(4, 8\)"
    ):
        _load(vllm_fp8, ckpt, t, 0, "mlp", 0, TP, list(items.items()))


def test_a_dequantized_tensor_for_an_fp8_parameter_is_refused(vllm_fp8, fp8_ckpt):
    from glm5_next_hpu.vllm.fp8 import dequantize_block_fp8
    from glm5_next_hpu.vllm.loader import CheckpointLoadError

    ckpt, qc, t = fp8_ckpt
    items = _mlp_items(ckpt)
    key = f"{LAYERS}.0.mlp.gate_proj.weight"
    items[key] = dequantize_block_fp8(
        items[key], items.pop(key + "_scale_inv"), tuple(qc["weight_block_size"]), torch.float32
    )
    with pytest.raises(
        CheckpointLoadError,
        match=r"gate_proj\.weight: checkpoint dtype torch\.float32 into parameter .* of dtype torch\.float8_e4m3fn",
    ):
        _load(vllm_fp8, ckpt, t, 0, "mlp", 0, TP, list(items.items()))


def test_negative_control_a_dropped_scale_load_is_caught(vllm_fp8, fp8_ckpt, monkeypatch):
    """A pairing that forgets to hand on one scale: the byte count names the unfilled scale."""
    from glm5_next_hpu.vllm import fp8 as fp8_mod
    from glm5_next_hpu.vllm.loader import CheckpointLoadError

    ckpt, _, t = fp8_ckpt
    pair = fp8_mod.Fp8Pairing._pair

    def drop_down_proj_scale(self, key, weight, scale_inv):
        return [
            item
            for item in pair(self, key, weight, scale_inv)
            if item[0] != f"{LAYERS}.0.mlp.down_proj.weight_scale_inv"
        ]

    monkeypatch.setattr(fp8_mod.Fp8Pairing, "_pair", drop_down_proj_scale)
    with pytest.raises(
        CheckpointLoadError, match=r"1 parameters not fully loaded:\n  - .*down_proj\.weight_scale_inv: 0 of 16"
    ):
        _load(vllm_fp8, ckpt, t, 0, "mlp", 1, TP)


def test_negative_control_a_scale_from_the_wrong_rank_is_caught(vllm_fp8, fp8_ckpt, monkeypatch):
    """A loader that narrowed a scale to the other rank's blocks: the byte comparison sees it."""
    import glm5_next_hpu.vllm.loader as loader

    ckpt, _, t = fp8_ckpt
    region = loader._region

    def other_rank_for_scales(dest, tensor, key, param, name, tp_rank, tp_size):
        return region(dest, tensor, key, param, name, 1 - tp_rank if key.endswith("_scale_inv") else tp_rank, tp_size)

    monkeypatch.setattr(loader, "_region", other_rank_for_scales)
    module, _, part = _load(vllm_fp8, ckpt, t, 0, "mlp", 0, TP)
    key = f"{LAYERS}.0.mlp.up_proj.weight_scale_inv"
    assert not _same_bytes(module.up_proj.weight_scale_inv.data, _rank_slice(key, part[key], 0, TP))
