"""vllm-gaudi wraps MoE weight loaders in extension.ops.synced_weight_loader (HPUFp8MoEMethod,
ModelOpt). The loaders answer `return_success=True` with a bool that the model's load_weights
(DeepSeek-V2 family, and the GLM-5.3-Flash port) uses to mark an expert weight as loaded; the
wrapper must hand it back, and still synchronise once per call."""

import types

import pytest
import torch


@pytest.fixture()
def ops(tree, monkeypatch):
    import vllm_gaudi.extension.ops as ops

    syncs = []
    monkeypatch.setattr(torch.hpu, "synchronize", lambda: syncs.append(1), raising=False)
    ops.syncs = syncs
    return ops


def test_return_success_comes_back(ops):
    calls = []

    def loader(param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        calls.append(expert_id)
        local = expert_id < 2
        return local if return_success else None

    wrapped = ops.synced_weight_loader(loader)
    p = torch.nn.Parameter(torch.zeros(2))
    assert wrapped(p, torch.ones(2), "w1", "w1", 0, return_success=True) is True
    assert wrapped(p, torch.ones(2), "w1", "w1", 5, return_success=True) is False
    assert wrapped(p, torch.ones(2), "w1", "w1", 1) is None
    assert calls == [0, 5, 1] and len(ops.syncs) == 3


def test_real_fused_moe_loader_reports_a_non_local_expert(ops):
    # The real RoutedExperts.weight_loader, on an expert this rank does not hold (expert parallel).
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    experts = object.__new__(RoutedExperts)
    torch.nn.Module.__init__(experts)
    experts.quant_config = None
    experts.quant_method = object()
    experts.expert_map_manager = types.SimpleNamespace(map_global_to_local=lambda e: -1)
    param = torch.nn.Parameter(torch.zeros(4, 8))
    loader = ops.synced_weight_loader(experts.weight_loader)

    ok = loader(param, torch.ones(8), "experts.7.down_proj.weight", shard_id="w2", expert_id=7, return_success=True)
    assert ok is False, f"loader answered {ok!r}; load_weights cannot tell a skipped expert from a loaded one"
    assert torch.count_nonzero(param) == 0
