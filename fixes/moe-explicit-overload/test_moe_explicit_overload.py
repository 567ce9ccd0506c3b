"""The per-channel FP8 MoE op calls torch.ops.hpu.mixture_of_experts through a named
overload: the same kernel the overload packet resolves to, without the packet's per-call
overload search, which reads a one-element scale tensor on the host (Tensor.item()) while
it tries the *_scalars overloads.

The Gaudi plugin is not on PyPI, so this test registers `hpu::mixture_of_experts` with
the overloads of the plugin, in the plugin's order, with the argument lists of its
kernels (mixture_of_experts_fp8_fused_weights*, habana_frameworks pytorch-integration),
and `hpu::cast_to_fp8_v2`. Their CPU bodies compute a plain FP8 MoE. The op class, the
dynamic quantisation and the call are the real vllm-gaudi code."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

H, INTER, EXPERTS, TOPK = 16, 8, 4, 2
_HEAD = "Tensor hidden_states, Tensor expert_routing_table, Tensor router_weights, "
_TAIL = ("bool permuted_weights, str activation, int experts_min, int experts_max, *, int chunk_size=0, "
         "int total_experts=0) -> Tensor")
# Overloads in the order the plugin defines them.
_OVERLOADS = {
    "default": "Tensor[] w1, Tensor[] w2, Tensor[] w3, ",
    "fused_weights": "Tensor[] w12, Tensor[] w3, ",
    "fp8": ("Tensor[] w1, Tensor[] w2, Tensor[] w3, Tensor d_scale_hidden_states, "
            "Tensor[] d_scale_intermediate_hidden_states, Tensor[] d_scale_w1, Tensor[] d_scale_w2, "
            "Tensor[] d_scale_w3, "),
    "fp8_fused_weights": ("Tensor[] w12, Tensor[] w3, Tensor d_scale_hidden_states, "
                          "Tensor[] d_scale_intermediate_hidden_states, Tensor[] d_scale_w12, Tensor[] d_scale_w3, "),
    "fp8_scalars": ("Tensor[] w1, Tensor[] w2, Tensor[] w3, float d_scale_hidden_states, "
                    "float[] d_scale_intermediate_hidden_states, float[] d_scale_w1, float[] d_scale_w2, "
                    "float[] d_scale_w3, "),
    "fp8_fused_weights_scalars": ("Tensor[] w12, Tensor[] w3, float d_scale_hidden_states, "
                                  "float[] d_scale_intermediate_hidden_states, float[] d_scale_w12, "
                                  "float[] d_scale_w3, "),
    "fp8_dynamic": ("Tensor[] w1, Tensor[] w2, Tensor[] w3, Tensor d_scale_hidden_states, Tensor[] d_scale_w1, "
                    "Tensor[] d_scale_w2, Tensor[] d_scale_w3, "),
    "fp8_fused_weights_dynamic": ("Tensor[] w12, Tensor[] w3, Tensor d_scale_hidden_states, Tensor[] d_scale_w12, "
                                  "Tensor[] d_scale_w3, "),
    "fp8_scalars_dynamic": ("Tensor[] w1, Tensor[] w2, Tensor[] w3, float d_scale_hidden_states, "
                            "float[] d_scale_w1, float[] d_scale_w2, float[] d_scale_w3, "),
    "fp8_fused_weights_scalars_dynamic": ("Tensor[] w12, Tensor[] w3, float d_scale_hidden_states, "
                                          "float[] d_scale_w12, float[] d_scale_w3, "),
}
RAN = []


def _fused_fp8_moe(name):

    def impl(hidden_states, expert_routing_table, router_weights, w12, w3, d_scale_hidden_states, *scales_and_flags,
             **kw):
        RAN.append(name)
        d_w12, d_w3 = scales_and_flags[-6], scales_and_flags[-5]
        x = hidden_states.float() * d_scale_hidden_states
        out = torch.zeros(x.shape, dtype=torch.float32)
        for k in range(expert_routing_table.shape[1]):
            for e in range(len(w12)):
                rows = expert_routing_table[:, k] == e
                gate_up = x[rows] @ (w12[e].float() * d_w12[e].unsqueeze(-1)).T
                gate, up = gate_up.chunk(2, dim=-1)
                down = (F.silu(gate) * up) @ (w3[e].float() * d_w3[e].unsqueeze(-1)).T
                out[rows] += router_weights[rows, k:k + 1].float() * down
        return out.to(torch.bfloat16)

    return impl


def _cast_to_fp8_v2(input, scale=None, stochastic_rounding=False, is_amax=False, dtype=None):
    return (input.float() * scale).to(dtype), torch.zeros(())


@pytest.fixture(scope="module")
def hpu_moe_op():
    lib = torch.library.Library("hpu", "FRAGMENT")
    for name, args in _OVERLOADS.items():
        qual = "mixture_of_experts" if name == "default" else f"mixture_of_experts.{name}"
        lib.define(qual + "(" + _HEAD + args + _TAIL)
        if name.startswith("fp8_fused_weights"):
            lib.impl(qual, _fused_fp8_moe(name), "CPU")
    lib.define("cast_to_fp8_v2(Tensor input, Tensor? scale=None, bool stochastic_rounding=False, "
               "bool is_amax=False, ScalarType? dtype=None) -> (Tensor, Tensor)")
    lib.impl("cast_to_fp8_v2", _cast_to_fp8_v2, "CPU")
    yield lib
    lib._destroy()


def _moe_op(static_input_scale):
    from vllm_gaudi.extension.ops import VllmMixtureOfExpertsOpFP8PerChannel

    g = torch.Generator().manual_seed(0)
    op = VllmMixtureOfExpertsOpFP8PerChannel(EXPERTS, EXPERTS, 0, EXPERTS - 1)
    for e in range(EXPERTS):
        op.w13_list[e].set_weight(torch.randn(2 * INTER, H, generator=g).to(torch.float8_e4m3fn))
        op.w13_list[e].set_scale_inv_fp8(torch.rand(2 * INTER, generator=g) * 0.1)
        op.w2_list[e].set_weight(torch.randn(H, INTER, generator=g).to(torch.float8_e4m3fn))
        op.w2_list[e].set_scale_inv_fp8(torch.rand(H, generator=g) * 0.1)
    if static_input_scale:
        op.w13_input_scale = torch.nn.Parameter(torch.tensor(0.05), requires_grad=False)
        op.w2_input_scale = torch.full((EXPERTS, ), 0.05)
    return op


def _inputs(tokens):
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOPK] for _ in range(tokens)])
    weights = torch.rand(tokens, TOPK, generator=g).to(torch.bfloat16)
    return x, ids, weights


PATHS = [pytest.param(False, id="dynamic-scale"), pytest.param(True, id="static-scale")]


@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("static_input_scale", PATHS)
def test_runs_the_overload_the_packet_resolves_to(tree, hpu_moe_op, static_input_scale, tokens):
    op = _moe_op(static_input_scale)
    x, ids, weights = _inputs(tokens)
    RAN.clear()
    out = op(x, ids, weights)
    ran = list(RAN)
    assert len(ran) == 1

    # What the overload packet selects for the same call, and its output.
    captured = {}
    real_packet_call = torch.ops.hpu.mixture_of_experts

    class Recorder:

        def __call__(self, **kwargs):
            captured.update(kwargs)
            return real_packet_call(**kwargs)

        def __getattr__(self, name):
            overload = getattr(real_packet_call, name)
            return lambda **kwargs: (captured.update(kwargs), overload(**kwargs))[1]

    orig = torch.ops.hpu.mixture_of_experts
    torch.ops.hpu.__dict__["mixture_of_experts"] = Recorder()
    try:
        op(x, ids, weights)
    finally:
        torch.ops.hpu.__dict__["mixture_of_experts"] = orig
    RAN.clear()
    via_packet = orig(**captured)
    assert RAN == ran, f"op ran {ran}, the packet resolves the same call to {RAN}"
    assert torch.equal(out, via_packet)


@pytest.mark.parametrize("static_input_scale", PATHS)
def test_one_token_moe_reads_nothing_back_to_the_host(tree, hpu_moe_op, static_input_scale):
    """At one decode token the per-token input scale has one element; the packet's search
    converts it with .item() for the float-typed *_scalars overloads (a device-to-host
    sync on HPU) before rejecting them."""
    op = _moe_op(static_input_scale)
    x, ids, weights = _inputs(1)
    op(x, ids, weights)  # first call builds the cached weight views
    with profile() as prof:
        op(x, ids, weights)
    reads = [e.name for e in prof.events() if e.name in ("aten::item", "aten::_local_scalar_dense")]
    assert reads == [], f"MoE call read tensors back to the host: {reads}"
