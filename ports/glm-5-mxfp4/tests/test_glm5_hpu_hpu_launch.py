"""The HPU model's start-up check (glm5_hpu/hpu_launch.py) and the router keys it fills
(glm5_hpu/router_config.py), without vLLM. The check running inside vllm-gaudi's runner is
tests/e2e/test_vllm_gaudi_emulation.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from glm5_hpu.hpu_launch import hpu_not_built
from glm5_hpu.placement import FORMAT
from glm5_hpu.router_config import ROUTER_DEFAULTS, fill_router_defaults, is_glm_moe_dsa
from glm5_hpu.switches import read_switches

SERVED = dict(GLM_MXK="0", GLM_MXK_PREFILL="0", GLM_EARLY_DRAFT="0", GLM_SPEC_DEVICE_REJECT="0")


NO_KERNELS = "the MXFP4 MoE kernels are not built"


def _problems(env, max_model_len=4096, speculative=True, kernels_missing=NO_KERNELS, **launch):
    return hpu_not_built(
        read_switches(env),
        max_model_len=max_model_len,
        speculative=speculative,
        kernels_missing=kernels_missing,
        **launch,
    )


def test_what_is_built_passes():
    assert _problems(SERVED) == []
    assert _problems({**SERVED, "GLM_DSA_SPARSE": "0"}, max_model_len=131072) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"GLM_MXK": "1"}, "GLM_MXK=1"),
        ({"GLM_MXK": ""}, "GLM_MXK=auto"),  # unset: auto means the kernels on HPU
        ({"GLM_MXK_PREFILL": "1"}, "GLM_MXK_PREFILL=1"),
        ({"GLM_ROUTER_FAST": "0"}, "GLM_ROUTER_FAST=0"),
    ],
)
def test_each_path_not_built_is_named_with_what_to_set(change, named):
    problems = _problems({**SERVED, **change})
    assert len(problems) == 1 and problems[0].startswith(named), problems
    assert "set" in problems[0] or "unset" in problems[0]


class _Glm:
    """The config keys the two MoE checks read (transformers' GlmMoeDsaConfig has them)."""

    n_routed_experts, num_hidden_layers, first_k_dense_replace, num_nextn_predict_layers = 8, 3, 1, 1
    moe_intermediate_size = 192


def test_moe_tp_is_served_with_expert_parallel_over_a_tp_size_it_divides():
    env = {**SERVED, "GLM_MOE_TP": "2"}
    for tp in (2, 4, 8):
        assert _problems(env, tensor_parallel=tp, expert_parallel=True, hf_config=_Glm()) == []
    glm53 = _Glm()
    glm53.moe_intermediate_size = 2048  # GLM-5.3's: 4 parts of 512 (16 blocks each)
    assert _problems({**env, "GLM_MOE_TP": "4"}, tensor_parallel=8, expert_parallel=True, hf_config=glm53) == []


@pytest.mark.parametrize(
    ("moe_tp", "kw", "said"),
    [
        (
            "3",
            dict(tensor_parallel=8, expert_parallel=True),
            "GLM_MOE_TP=3: does not divide the tensor-parallel size 8",
        ),
        (
            "2",
            dict(tensor_parallel=1, expert_parallel=True),
            "GLM_MOE_TP=2: does not divide the tensor-parallel size 1",
        ),
        (
            "2",
            dict(tensor_parallel=2),
            "GLM_MOE_TP=2: the expert-group layout is expert parallelism: add --enable-expert-parallel",
        ),
        ("2", dict(tensor_parallel=2, expert_parallel=True, data_parallel=2), "GLM_MOE_TP=2 with data-parallel size 2"),
        (
            "8",
            dict(tensor_parallel=8, expert_parallel=True),
            "GLM_MOE_TP=8: moe_intermediate_size 192 does not split into 8 parts of whole 32-element MXFP4 blocks",
        ),
    ],
)
def test_a_moe_tp_that_cannot_be_laid_out_is_refused_naming_why(moe_tp, kw, said):
    (problem,) = _problems({**SERVED, "GLM_MOE_TP": moe_tp}, hf_config=_Glm(), **kw)
    assert problem.startswith(said) and problem.endswith("or set GLM_MOE_TP=1 (whole experts per card)"), problem


def test_a_placement_file_is_checked_at_start_up(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(json.dumps({"format": FORMAT, "n_routed_experts": 8, "layers": {"1": [3, 1, 2, 0, 4, 5, 6, 7]}}))
    assert _problems({**SERVED, "GLM_MOE_PLACEMENT": str(good)}, hf_config=_Glm()) == []
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": FORMAT, "n_routed_experts": 8, "layers": {"2": [3, 1, 2, 0, 4, 5, 6, 3]}}))
    (problem,) = _problems({**SERVED, "GLM_MOE_PLACEMENT": str(bad)}, hf_config=_Glm())
    assert problem == (
        f"GLM_MOE_PLACEMENT={bad}: {bad}: layer 2: expert 3 appears twice (slots 0 and 7); fix the file or unset it"
    )
    (problem,) = _problems({**SERVED, "GLM_MOE_PLACEMENT": str(tmp_path / "none.json")}, hf_config=_Glm())
    assert problem.startswith(f"GLM_MOE_PLACEMENT={tmp_path / 'none.json'}: ") and "cannot read" in problem


def test_kernel_switches_pass_where_the_kernels_can_run_and_say_why_not_elsewhere():
    env = {**SERVED, "GLM_MXK": "1", "GLM_MXK_PREFILL": ""}
    assert _problems(env, kernels_missing=None) == []
    problems = _problems(env)
    assert problems == [
        f"GLM_MXK=1: {NO_KERNELS}; set GLM_MXK=0 for vllm-gaudi's stock MXFP4 MoE op",
        f"GLM_MXK_PREFILL=auto (the kernels on HPU): {NO_KERNELS}; set GLM_MXK_PREFILL=0 for "
        "vllm-gaudi's stock MXFP4 MoE op",
    ]


def test_decode_levers_mean_nothing_without_speculation():
    env = {**SERVED, "GLM_EARLY_DRAFT": "1", "GLM_SPEC_DEVICE_REJECT": "1"}
    assert _problems(env, speculative=False) == []


def test_device_rejection_is_served():
    assert _problems({**SERVED, "GLM_SPEC_DEVICE_REJECT": "1"}) == []


def test_early_draft_is_served_with_speculation():
    # glm5_hpu/early_draft.py; run on the runner in tests/e2e/test_vllm_gaudi_mtp_levers.py
    assert _problems({**SERVED, "GLM_EARLY_DRAFT": "1"}) == []
    assert _problems({**SERVED, "GLM_EARLY_DRAFT": "1", "GLM_SPEC_DEVICE_REJECT": "1"}) == []


def test_sparse_attention_above_the_threshold_is_served_without_shared_indexer_layers():
    assert _problems(SERVED, max_model_len=32768) == []
    assert _problems(SERVED, max_model_len=131072) == []  # the top-k of glm5_hpu/hpu_dsa.py


def test_shared_indexer_layers_above_the_threshold_are_refused_naming_them():
    def problems(max_model_len, threshold=32768, env=SERVED):
        return hpu_not_built(
            read_switches(env),
            max_model_len=max_model_len,
            speculative=False,
            threshold=threshold,
            shared_indexer_layers=[3, 4],
        )

    assert problems(32768) == []  # dense MLA is exact there
    assert problems(131072, env={**SERVED, "GLM_DSA_SPARSE": "0"}) == []
    (problem,) = problems(131072)
    assert problem.startswith("GLM_DSA_SPARSE=1 with --max-model-len 131072") and "(3, 4)" in problem
    (problem,) = problems(512, threshold=16)  # a test threshold moves the limit
    assert "--max-model-len <= 16" in problem


def test_the_seed_launch_values_are_all_reported_at_once():
    seed = dict(
        GLM_DSA_SPARSE="1",
        GLM_MXK="1",
        GLM_MXK_PREFILL="1",
        GLM_MOE_TP="2",
        GLM_MOE_PLACEMENT="/opt/p.json",
        GLM_ROUTER_FAST="1",
        GLM_EARLY_DRAFT="1",
        GLM_SPEC_DEVICE_REJECT="1",
    )
    problems = _problems(seed, max_model_len=131072)
    # the recipe's GLM_MOE_TP=2 on one card (no TP, no expert parallel): refused for both
    assert [p.split("=")[0].split(" ")[0] for p in problems] == [
        "GLM_MXK",
        "GLM_MXK_PREFILL",
        "GLM_MOE_TP",
        "GLM_MOE_TP",
    ]
    # on the recipe's 8 cards with expert parallel, GLM_MOE_TP=2 is served (and the DSA top-k, the
    # early draft): only the kernels this machine lacks are named
    problems = _problems(seed, max_model_len=131072, tensor_parallel=8, expert_parallel=True)
    assert [p.split("=")[0] for p in problems] == ["GLM_MXK", "GLM_MXK_PREFILL"]


class _Config:
    model_type = "glm_moe_dsa"


def test_router_keys_filled_only_where_absent_and_only_for_glm_moe_dsa():
    cfg = _Config()
    assert fill_router_defaults(cfg) == ["scoring_func", "topk_method"]
    assert (cfg.scoring_func, cfg.topk_method) == (ROUTER_DEFAULTS["scoring_func"], ROUTER_DEFAULTS["topk_method"])
    kept = _Config()
    kept.scoring_func = "softmax"
    assert fill_router_defaults(kept) == ["topk_method"] and kept.scoring_func == "softmax"
    other = type("DeepseekV3Config", (), {"model_type": "deepseek_v3"})()
    assert fill_router_defaults(other) == [] and not hasattr(other, "scoring_func")


def test_an_mtp_draft_renamed_by_vllm_is_still_recognised():
    draft = _Config()
    draft.model_type = "deepseek_mtp"  # SpeculativeConfig.hf_config_override sets the instance attribute
    assert is_glm_moe_dsa(draft)
    assert fill_router_defaults(draft) == ["scoring_func", "topk_method"]


def test_switches_record_is_what_the_check_reads():
    fields = {f.name for f in dataclasses.fields(read_switches(SERVED))}
    assert {
        "mxk",
        "mxk_prefill",
        "moe_tp",
        "moe_placement",
        "router_fast",
        "early_draft",
        "spec_device_reject",
        "dsa_sparse",
    } == fields
