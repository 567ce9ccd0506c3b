"""GLM-5.3 (MXFP4) at the recipe's real shapes on meta tensors, through the port's DSA and MXFP4 MoE
dispatch code (``hpu_emulation.cost.glm53``): the traced steps give PREDICTIONS whose parts add up
and move the way the shapes say."""

from pathlib import Path

import pytest

from glm5_hpu.hpu_dsa import SCORE_BUDGET
from hpu_emulation.cost import GAUDI2, GAUDI3, REPLAY, Calibration, predict
from hpu_emulation.cost.glm53 import Glm53Model, Glm53Switches, dsa_scoring_peak, op_class

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "zai-org" / "GLM-5.3-BF16" / "recipe.yaml"


@pytest.fixture(scope="module")
def glm53():
    return Glm53Model(RECIPE)


def test_one_rank_holds_the_recipes_split(glm53):
    assert (glm53.dep.tp, glm53.dep.moe_tp, glm53.dep.mtp_layers) == (8, 2, 1)
    assert (glm53.heads, glm53.groups, glm53.local_experts, glm53.local_inter) == (8, 4, 64, 1024)


def test_decode_step_with_the_gemv_kernels(glm53):
    sw = Glm53Switches()
    trace = glm53.trace(sw, tokens=2, context=2048)
    names = {r.name for r in trace.records}
    assert "hpu_cost.mxfp4_gemv.default" in names  # GLM_MXK: decode-sized calls on the GEMV kernel
    assert "hpu.mixture_of_experts.mxfp4_fused_weights" not in names
    st = predict(trace.records, REPLAY, GAUDI2, Calibration(), op_class)
    assert st.total > st.device > 0 and st.segments == 1  # one captured graph a decode step
    assert st.by_class["MoE routed experts"] == max(st.by_class.values())
    assert predict(trace.records, REPLAY, GAUDI3, Calibration(), op_class).device < st.device


def test_prefill_takes_the_unpack_path_or_the_stock_op(glm53):
    on = glm53.trace(Glm53Switches(), tokens=2048, context=0)
    off = glm53.trace(Glm53Switches(mxk_prefill=False), tokens=2048, context=0)
    assert "hpu_cost.mxfp4_unpack.default" in {r.name for r in on.records}
    assert "hpu.mixture_of_experts.mxfp4_fused_weights" in {r.name for r in off.records}
    assert on.segments == off.segments == glm53.cfg.num_hidden_layers + 1  # a graph per layer, then the head


def test_dsa_prefill_scoring_peak_is_bounded_by_its_chunk_budget():
    """hpu_dsa.prefill_bias scores its queries in chunks (hpu_dsa.SCORE_BUDGET): the traced peak is
    at most the runner's bias and the new one (bf16, queries x keys each), the queries and one chunk's scoring,
    at 131,072 keys too, where one pass over 4,096 queries held ~128 GiB (32 heads x fp32 x
    queries x keys, and the sort indices)."""
    peaks = {(t, k): dsa_scoring_peak(t, k) for t, k in ((8192, 8192), (4096, 32768), (4096, 131072))}
    for (t, k), peak in peaks.items():
        bias, queries = t * k * 2, t * 32 * 128 * 4  # one bf16 bias, the fp32 queries
        assert bias < peak <= 2 * bias + queries + SCORE_BUDGET + 64 * 2**20, (t, k, peak)
    assert peaks[(4096, 131072)] < 4 * 2**30
    # negative control: one chunk of every query (an unbounded budget) holds the per-head scores
    t, k = 512, 8192
    assert dsa_scoring_peak(t, k, budget=1 << 50) >= t * k * 32 * 4
