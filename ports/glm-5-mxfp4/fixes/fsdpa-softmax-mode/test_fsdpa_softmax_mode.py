"""fsdpa-softmax-mode: VLLM_HPU_FSDPA_SOFTMAX_MODE chooses the softmax FusedSDPA runs in prompt
attention ("None", the kernel's accurate softmax, as the GLM-5.3 recipe's launch line sets it); unset,
the tree's own rule holds; any other value stops the start.

Real code: vllm_gaudi's runtime config, built as a server start builds it (the environment read
when it is made), ops.prompt_attention with impl fsdpa_impl and its _fsdpa_prompt_attention, and
GLM-5.3's MLA prefill, HPUMLAImpl.forward_mha, with the tree's ModuleFusedSDPA. The FusedSDPA
kernel is a stand-in that records the softmax mode it is called with (the Gaudi kernel and the
numeric effect of the mode run only on a card)."""

from types import SimpleNamespace

import pytest

VAR = "VLLM_HPU_FSDPA_SOFTMAX_MODE"
B, S, H, D = 1, 8, 2, 16  # batch, tokens, heads, head size


@pytest.fixture()
def config(tree, monkeypatch):
    # The Gaudi software version the runtime config reads from the bridge (stubbed): the
    # profile's base, Gaudi software 1.24.1.
    monkeypatch.setenv("VLLM_BUILD", "1.24.1.0")
    monkeypatch.delenv(VAR, raising=False)
    from vllm_gaudi.extension import runtime

    def start(**overrides):
        """The runtime config a server start makes, from the environment as it is now."""
        runtime.clear_config()
        # The card is the recipe's (Gaudi 2); detection asks the bridge (stubbed) for it, and
        # for the INC package of the Gaudi image (neural_compressor_pt) for the last two, which
        # only matter with data parallelism or per-token KV scales, unused here.
        return runtime.get_config(hw="gaudi2", use_dispatch_fn=False, per_token_kv_scaling_support=False, **overrides)

    yield start
    runtime.clear_config()


class Recorder:
    """Stands in for the fsdpa_op (or for FusedSDPA): records the softmax mode, the 8th
    positional argument of both, and returns an output of the query's shape."""

    def __init__(self):
        self.modes = []

    def __call__(self, *args):
        import torch

        self.modes.append(args[7])
        return torch.zeros_like(args[0])

    apply = __call__  # FusedSDPA.apply(q, k, v, mask, dropout_p, is_causal, scale, softmax_mode, ...)


def prompt(op):
    """One prompt through ops.prompt_attention, impl fsdpa_impl, with the arguments HPUMLAImpl's
    forward_mha passes; the softmax modes the op got."""
    import torch
    from vllm_gaudi.extension import ops

    q, k, v = (torch.randn(B, S, H, D) for _ in range(3))
    out = ops.prompt_attention(
        impl="fsdpa_impl",
        query=q,
        key=k,
        value=v,
        is_causal=True,
        attn_bias=None,
        position_bias=None,
        valid_seq_lengths=torch.tensor([S]),
        scale=D**-0.5,
        matmul_qk_op=torch.matmul,
        softmax_op=torch.softmax,
        matmul_av_op=torch.matmul,
        keys_fetch_func=None,
        values_fetch_func=None,
        fsdpa_op=op,
    )
    assert out.shape == q.shape
    return op.modes


@pytest.mark.parametrize(
    "mode, fp32_softmax",
    [("None", False), ("fp32", False), ("fast", True)],
    ids=["None", "fp32", "fast-over-fp32_softmax"],
)
def test_the_variable_chooses_fused_sdpa_s_softmax(config, monkeypatch, mode, fp32_softmax):
    monkeypatch.setenv(VAR, mode)
    config(fp32_softmax=fp32_softmax)
    assert prompt(Recorder()) == [mode]


def test_glm_mla_prefill_runs_fused_sdpa_with_the_accurate_softmax(config, monkeypatch):
    """The recipe launch line's VLLM_HPU_FSDPA_SOFTMAX_MODE=None reaches FusedSDPA.apply through the MLA
    prefill of GLM-5.3 (HPUMLAAttention.forward_impl calls impl.forward_mha for a prompt)."""
    import torch
    from vllm_gaudi.attention.backends.hpu_attn import HPUMLAImpl
    from vllm_gaudi.extension.utils import ModuleFusedSDPA

    monkeypatch.setenv(VAR, "None")
    cfg = config()
    assert cfg.prompt_attn_impl == "fsdpa_impl"  # FusedSDPA is there (on a card: the kernel)
    rank, rope, nope, vdim = 32, 8, 16, 16
    kernel = Recorder()
    kv_b = torch.randn(rank, H * (nope + vdim))
    impl = SimpleNamespace(  # the fields forward_mha reads, as HPUMLAImpl.__init__ sets them
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        qk_head_dim=nope + rope,
        v_head_dim=vdim,
        num_heads=H,
        scale=(nope + rope) ** -0.5,
        kv_b_proj=lambda x: (x @ kv_b,),
        use_merged_prefill=False,
        prefill_impl=cfg.prompt_attn_impl,
        matmul_qk=torch.matmul,
        softmax=torch.softmax,
        matmul_av=torch.matmul,
        latent_cache_k=SimpleNamespace(fetch_from_cache=None),
        fused_scaled_dot_product_attention=ModuleFusedSDPA(kernel),
    )
    md = SimpleNamespace(block_list=None, seq_lens_tensor=torch.tensor([S]), attn_bias=None)
    q = torch.randn(S, H, nope + rope)
    latent = torch.randn(S, rank + rope)
    out = HPUMLAImpl.forward_mha(impl, q, latent, None, md)
    assert out.shape == (S, H * vdim)
    assert kernel.modes == ["None"]


@pytest.mark.parametrize("fp32_softmax, mode", [(False, "fast"), (True, "fp32")])
def test_unset_keeps_the_tree_s_rule(config, fp32_softmax, mode):
    config(fp32_softmax=fp32_softmax)
    assert prompt(Recorder()) == [mode]


@pytest.mark.parametrize("value", ["accurate", "none"])
def test_a_value_that_is_no_mode_stops_the_start(config, monkeypatch, value):
    """HPUModelRunner.__init__ finalizes the runtime config (every value computed): a value
    FusedSDPA does not take stops the server there, before any request, saying what is allowed."""
    from vllm_gaudi.extension import runtime

    monkeypatch.setenv(VAR, value)
    config()
    try:
        runtime.finalize_config()
    except ValueError as e:
        error = str(e)
    else:
        error = None
    assert error is not None, f"{VAR}={value} accepted"
    assert VAR in error and repr(value) in error
    assert all(m in error for m in ("None", "fast", "fp32"))
