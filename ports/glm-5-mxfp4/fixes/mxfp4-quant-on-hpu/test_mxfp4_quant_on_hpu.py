"""mxfp4-quant-on-hpu: vLLM accepts the glm-5-mxfp4 converter's checkpoint (quant_method mxfp4,
model glm_moe_dsa) on HPU instead of refusing it before loading.

Real code: vLLM's ModelConfig reads the checkpoint's config.json and verifies its quantization as
`vllm serve` does; the platform it asks is the tree's HpuPlatform (on a machine without Gaudi
software vLLM would resolve the CPU platform, so the test sets it where ModelConfig reads it)."""

import pytest

# HpuPlatform.supported_quantization on vllm-gaudi main 091bbad, before the fix
STOCK = ["compressed-tensors", "fp8", "inc", "awq_hpu", "gptq_hpu", "modelopt", "gpt_oss_mxfp4"]


@pytest.fixture()
def hpu(tree, monkeypatch):
    import vllm.config.model as model_config
    from vllm_gaudi.platform import HpuPlatform

    monkeypatch.setattr(model_config, "current_platform", HpuPlatform())
    # ModelConfig inspects the architecture in a subprocess: it must import the tree's vLLM too
    monkeypatch.setenv("PYTHONPATH", str(tree))
    return HpuPlatform


def checkpoint(path):
    """The config.json of a tiny GLM-5.3 as the port's converter writes it (no weights: vLLM
    verifies the quantization before it loads any)."""
    from packtests import glm_moe_dsa_tiny

    cfg = glm_moe_dsa_tiny.config(num_hidden_layers=2, architectures=["GlmMoeDsaForCausalLM"])
    # glm5_mxfp4.convert.quantization_config's keys vLLM reads (the rest are the converter's record)
    cfg.quantization_config = {"quant_method": "mxfp4", "block_size": 32}
    cfg.save_pretrained(path)
    return str(path)


@pytest.mark.red_raises("ValueError")  # "mxfp4 quantization is currently not supported in hpu."
def test_vllm_accepts_the_converters_mxfp4_checkpoint_on_hpu(hpu, tmp_path):
    from vllm.config import ModelConfig

    cfg = ModelConfig(model=checkpoint(tmp_path), skip_tokenizer_init=True)
    # vLLM's generic Mxfp4Config, not gpt-oss's: the one whose MoE method mxfp4-moe-non-gpt-oss
    # gives the HPU kernel set-up
    assert cfg.quantization == "mxfp4"


def test_the_stock_methods_stay_and_others_are_still_refused(hpu):
    """The list only grows: every method vllm-gaudi supported before is still accepted, and the
    platform still refuses a method it does not list (the check is not switched off)."""
    for name in STOCK:
        hpu.verify_quantization(name)
    with pytest.raises(ValueError, match="not supported in hpu"):
        hpu.verify_quantization("gguf")
