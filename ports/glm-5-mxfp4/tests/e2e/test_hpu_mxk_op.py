"""GLM_MXK / GLM_MXK_PREFILL's op (glm5_hpu/hpu_mxk.py GlmMxkMoEOp) on the emulated card, against
the stock fused MXFP4 MoE op it wraps (torch.ops.hpu.mixture_of_experts.mxfp4_fused_weights, which
vllm-gaudi's VllmMixtureOfExpertsOpMXFP4 calls). The kernels are their operation order in PyTorch
(glm5_hpu/mxk.py), as on the emulation. Emulated results, not a card's.

* the prefill unpack (256 to 4,096 rows): bit-identical to the stock op;
* the decode GEMV (at most 16 rows): the float32 sums of each token's experts within bf16 rounding
  of a float64 reference, an expert another rank holds adds nothing, no host synchronisation in a
  captured region (the router's choices stay on the card);
* other sizes: the stock op itself.
Runs in the mxfp4-runner stage (its own process: the emulation is activated here).
"""

from __future__ import annotations

import pytest
import torch

from packtests import emulated_card

emulated_card.require_own_process()

from glm5_hpu import hpu_mxk, mxk  # noqa: E402
from glm5_hpu.moe_mxfp4 import dequantize  # noqa: E402

pytestmark = pytest.mark.slow  # activates the emulation in this process: the mxfp4-runner stage runs it
E, H, INTER = 4, 256, 64  # local experts, hidden, intermediate (whole 32-blocks; H spans two GEMV chunks)


@pytest.fixture(scope="module")
def hpu():
    return emulated_card.activate()


def _experts(seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(0, 256, (E, 2 * INTER, H // 2), generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, INTER // 2), generator=g, dtype=torch.uint8)
    # scale codes near 2^-4: weights of real-model size, no inf or NaN
    s13 = torch.randint(119, 125, (E, 2 * INTER, H // 32), generator=g, dtype=torch.uint8)
    s2 = torch.randint(119, 125, (E, H, INTER // 32), generator=g, dtype=torch.uint8)
    return w13, s13, w2, s2


class _Weight(torch.nn.Module):
    def __init__(self, weight, scale):
        super().__init__()
        self.weight, self.scale = weight, scale


class StockMxfp4(torch.nn.Module):
    """The stock op's call, as VllmMixtureOfExpertsOpMXFP4.forward makes it (per-expert views)."""

    def __init__(self, experts, experts_min):
        super().__init__()
        w13, s13, w2, s2 = experts
        self.experts_min, self.experts_max = experts_min, experts_min + w13.shape[0] - 1
        self.w13_list = torch.nn.ModuleList(_Weight(w13[e], s13[e]) for e in range(w13.shape[0]))
        self.w2_list = torch.nn.ModuleList(_Weight(w2[e], s2[e]) for e in range(w2.shape[0]))
        self.calls = 0

    def forward(self, x, ids, weights, permuted_weights=True, activation="silu"):
        self.calls += 1
        return torch.ops.hpu.mixture_of_experts.mxfp4_fused_weights(
            x,
            ids.to(torch.int32),
            weights,
            [m.weight for m in self.w13_list],
            [m.weight for m in self.w2_list],
            [m.scale for m in self.w13_list],
            [m.scale for m in self.w2_list],
            block_size=32,
            permuted_weights=permuted_weights,
            activation=activation,
            experts_min=self.experts_min,
            experts_max=self.experts_max,
        )


def _ops(experts_min=0, seed=0):
    experts = tuple(t.to("hpu") for t in _experts(seed))
    stock = StockMxfp4(experts, experts_min)
    kernels = hpu_mxk.Kernels(mxk.gemv_bf16, mxk.unpack_bf16, "emulation")
    return stock, hpu_mxk.GlmMxkMoEOp(stock, kernels, experts, decode=True, prefill=True), experts


def _inputs(tokens, n_experts, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(n_experts, generator=g)[:2] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand(tokens, 2, generator=g).to(torch.bfloat16)
    return x.to("hpu"), ids.to("hpu"), weights.to("hpu")


def test_kernels_resolve_to_their_emulation_here(hpu):
    found = hpu_mxk.kernels()
    assert isinstance(found, hpu_mxk.Kernels) and found.where == "emulation"
    assert found.gemv is mxk.gemv_bf16 and found.unpack is mxk.unpack_bf16


def test_paths_by_call_size(hpu):
    _, op, _ = _ops()
    assert [op.path(t) for t in (1, 16, 17, 255, 256, 4096, 4097)] == [
        "gemv",
        "gemv",
        "stock",
        "stock",
        "unpack",
        "unpack",
        "stock",
    ]


def test_prefill_unpack_is_bit_identical_to_the_stock_op(hpu):
    stock, op, _ = _ops()
    x, ids, weights = _inputs(256, E)
    want = stock(x, ids, weights)
    calls = stock.calls
    got = op(x, ids, weights)
    assert stock.calls == calls  # the unpack path, not the stock op
    assert got.device.type == "hpu" and got.dtype == torch.bfloat16
    assert torch.equal(got.cpu().view(torch.int16), want.cpu().view(torch.int16))


def _reference(x, ids, weights, experts, experts_min):
    """float64: each token's chosen local experts, SiLU(gate) x up rounded to bf16 as the op does."""
    w13, s13, w2, s2 = (t.cpu() for t in experts)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k]) - experts_min
            if not 0 <= e < w13.shape[0]:
                continue
            gate, up = (x[t].double() @ dequantize(w13[e], s13[e]).double().T).chunk(2)
            h = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).double()
            out[t] += float(weights[t, k]) * (h @ dequantize(w2[e], s2[e]).double().T)
    return out


@pytest.mark.parametrize("experts_min", [0, 2], ids=["all-local", "expert-parallel"])
def test_decode_gemv_matches_a_float64_reference_and_the_stock_op(hpu, experts_min):
    stock, op, experts = _ops(experts_min)
    x, ids, weights = _inputs(4, E + experts_min)
    if experts_min:  # token 0 chose two experts another rank holds, token 1 one of each
        ids = torch.tensor([[0, 1], [1, experts_min + 1]], dtype=torch.int32).to("hpu").repeat(2, 1)
    got = op(x, ids, weights).cpu().double()
    want = _reference(x.cpu(), ids.cpu(), weights.cpu(), experts, experts_min)
    scale = want.abs().max().item()
    assert scale > 0
    assert (got - want).abs().max().item() <= 2**-7 * scale  # bf16 output rounding, and the h rounding
    assert (got - stock(x, ids, weights).cpu().double()).abs().max().item() <= 2**-6 * scale
    if experts_min:  # a token whose both experts another rank holds gets nothing
        remote = ((ids.cpu() < experts_min) | (ids.cpu() > experts_min + E - 1)).all(dim=1)
        assert remote.tolist() == [True, False, True, False] and got[remote].abs().max().item() == 0.0


def test_decode_gemv_reads_nothing_back_inside_a_captured_step(hpu):
    _, op, _ = _ops()
    x, ids, weights = _inputs(3, E)
    hpu.strict(True)
    try:
        with hpu.step("glm mxk decode") as rec, hpu.graph_region():
            op(x, ids, weights)
    finally:
        hpu.strict(False)
    assert rec.syncs == []


def test_other_sizes_call_the_stock_op(hpu):
    stock, op, _ = _ops()
    x, ids, weights = _inputs(40, E)
    calls = stock.calls
    assert torch.equal(op(x, ids, weights).cpu(), stock(x, ids, weights).cpu())
    assert stock.calls == calls + 2
