"""Tensor and expert parallelism of the vLLM model, two ranks in one process.

Each case loads the tiny reference checkpoint through the port's loader into a TP 1 layer and
into the rank 0 and rank 1 layers of TP 2 (with and without expert parallelism), then checks
that each rank holds exactly its split of the TP 1 parameters, and that the rank outputs,
combined as vLLM's collectives combine them (all-reduce = sum, all-gather = concat), equal the
TP 1 output. The collectives are counted: one all-reduce per row-parallel block, as vLLM has it.
The KDA layer needs vLLM (run under .venv-cpu, tests/e2e/run.sh); the rest runs anywhere.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from glm5_next_hpu.config import UnsupportedConfigError, validate_config
from glm5_next_hpu.vllm.loader import load_checkpoint
from glm5_next_hpu.vllm.parallel import (
    ColumnLinear,
    LMHead,
    Parallel,
    ParallelMoE,
    RowLinear,
    VocabEmbedding,
    decoder_mlp,
)

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not importable here (run under .venv-cpu)"
)
TP = 2
LAYERS = "model.language_model.layers"


@pytest.fixture(scope="module")
def ref_ckpt():
    from packtests.flash_reference import build_reference, checkpoint_tensors

    ref, cfg = build_reference()
    return checkpoint_tensors(ref), cfg


class Counter:
    def __init__(self):
        self.reduces = 0

    def reduce(self, x):
        self.reduces += 1
        return x  # the caller sums the ranks' partial results


def _under(layer_idx: int, sub: str, module: torch.nn.Module) -> torch.nn.Module:
    """``module`` at model.language_model.layers.<i>.<sub>, so its parameter names are the checkpoint's."""
    root = torch.nn.Module()
    node = root
    for part in ["model", "language_model"]:
        setattr(node, part, torch.nn.Module())
        node = getattr(node, part)
    node.layers = torch.nn.ModuleDict({str(layer_idx): torch.nn.Module()})
    setattr(node.layers[str(layer_idx)], sub, module)
    return root


def _load(ckpt, prefix: str, module, layers: int, rank=0, size=1):
    part = {k: v for k, v in ckpt.items() if k.startswith(prefix)}
    return load_checkpoint(module, part.items(), layers, tp_rank=rank, tp_size=size), part


def _build(make, ckpt, cfg, layer_idx, sub, rank=0, size=1, ep=False):
    counter = Counter()
    par = Parallel(rank, size, ep, reduce=counter.reduce, gather=lambda x: x)
    inner = make(par)
    report, part = _load(
        ckpt,
        f"{LAYERS}.{layer_idx}.{sub}.",
        _under(layer_idx, sub, inner),
        cfg.text_config.num_hidden_layers,
        rank,
        size,
    )
    return inner, report, counter, part


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_moe_ranks_hold_their_split_and_sum_to_tp1(ref_ckpt, ep):
    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    make = lambda par: ParallelMoE(t, par)  # noqa: E731
    full, _, c1, _ = _build(make, ckpt, cfg, 1, "mlp")
    ranks = [_build(make, ckpt, cfg, 1, "mlp", r, TP, ep) for r in range(TP)]
    E, inter = t.n_routed_experts, t.moe_intermediate_size
    x = torch.randn(37, t.hidden_size, generator=torch.Generator().manual_seed(3))
    want = full(x)
    assert c1.reduces == 0  # TP 1: no collective
    got = sum(m(x) for m, _, _, _ in ranks)
    for r, (m, report, counter, part) in enumerate(ranks):
        assert counter.reduces == 1  # routed + shared reduced once, DeepSeek-V2's order
        w13, w2 = full.experts.w13_weight, full.experts.w2_weight
        if ep:  # whole experts: rank r holds experts [r*E/TP, (r+1)*E/TP)
            n = E // TP
            assert torch.equal(m.experts.w13_weight, w13[r * n : (r + 1) * n])
            assert torch.equal(m.experts.w2_weight, w2[r * n : (r + 1) * n])
            mine = {k for k in part if ".experts." in k and int(k.split(".experts.")[1].split(".")[0]) // n == r}
            assert {k for k in report.loaded_keys if ".experts." in k} == mine
            assert set(report.other_rank_keys) == {k for k in part if ".experts." in k} - mine
        else:  # every expert, 1/TP of the intermediate dim of gate, of up and of down
            i = inter // TP
            sl = slice(r * i, (r + 1) * i)
            assert torch.equal(m.experts.w13_weight, torch.cat([w13[:, :inter][:, sl], w13[:, inter:][:, sl]], dim=1))
            assert torch.equal(m.experts.w2_weight, w2[:, :, sl])
            assert report.loaded_keys == set(part) and not report.other_rank_keys
        assert torch.equal(m.gate.weight, full.gate.weight)  # router replicated
        assert torch.equal(m.gate.e_score_correction_bias, full.gate.e_score_correction_bias)
        i = inter * t.n_shared_experts // TP
        assert torch.equal(m.shared_experts.gate_proj.weight, full.shared_experts.gate_proj.weight[r * i : (r + 1) * i])
        assert torch.equal(
            m.shared_experts.down_proj.weight, full.shared_experts.down_proj.weight[:, r * i : (r + 1) * i]
        )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # The test sees the experts: the routed part alone differs from the whole output.
    assert not torch.allclose(ranks[0][0](x), want, atol=1e-3)


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_block_fp8_moe_loads_into_rank_halves_as_the_tp1_split(ref_ckpt, ep):
    """A block-FP8 checkpoint (16 x 16 blocks) goes through the same split: every FP8 weight is
    dequantized whole with its scale, then narrowed to the rank's slice (or, with EP, kept by
    the rank that holds its expert)."""
    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec, quantize_block_fp8

    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    spec = BlockFp8Spec.from_quantization_config(
        {"quant_method": "fp8", "weight_block_size": [16, 16], "modules_to_not_convert": ["mlp.gate"]}
    )
    prefix = f"{LAYERS}.1.mlp."
    stream = []
    for k, v in ckpt.items():
        if k.startswith(prefix) and k.endswith(".weight") and ".mlp.gate." not in k:
            q, sc = quantize_block_fp8(v, spec.block)
            stream += [(k, q), (k + "_scale_inv", sc)]
        elif k.startswith(prefix):
            stream.append((k, v))

    def load(rank, size):
        m = ParallelMoE(t, Parallel(rank, size, ep))
        report = load_checkpoint(_under(1, "mlp", m), stream, t.num_hidden_layers, tp_rank=rank, tp_size=size, fp8=spec)
        return m, report

    full, full_report = load(0, 1)
    assert full_report.fp8_dequantized  # the weights did come in as FP8
    E, inter = t.n_routed_experts, t.moe_intermediate_size
    for r in range(TP):
        m, report = load(r, TP)
        w13, w2 = full.experts.w13_weight, full.experts.w2_weight
        if ep:
            n = E // TP
            assert torch.equal(m.experts.w13_weight, w13[r * n : (r + 1) * n])
            assert torch.equal(m.experts.w2_weight, w2[r * n : (r + 1) * n])
            assert report.other_rank_keys
        else:
            sl = slice(r * inter // TP, (r + 1) * inter // TP)
            assert torch.equal(m.experts.w13_weight, torch.cat([w13[:, :inter][:, sl], w13[:, inter:][:, sl]], dim=1))
            assert torch.equal(m.experts.w2_weight, w2[:, :, sl])
        i = inter * t.n_shared_experts // TP
        assert torch.equal(m.shared_experts.up_proj.weight, full.shared_experts.up_proj.weight[r * i : (r + 1) * i])


def test_dense_mlp_ranks_sum_to_tp1(ref_ckpt):
    ckpt, cfg = ref_ckpt
    make = lambda par: decoder_mlp(cfg.text_config, 0, par)  # noqa: E731
    full, *_ = _build(make, ckpt, cfg, 0, "mlp")
    ranks = [_build(make, ckpt, cfg, 0, "mlp", r, TP) for r in range(TP)]
    x = torch.randn(9, cfg.text_config.hidden_size, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(sum(m(x) for m, *_ in ranks), full(x), rtol=1e-5, atol=1e-6)
    assert all(c.reduces == 1 for _, _, c, _ in ranks)
    i = cfg.text_config.intermediate_size // TP
    assert ranks[1][0].up_proj.weight.shape == (i, cfg.text_config.hidden_size)
    assert torch.equal(ranks[1][0].up_proj.weight, full.up_proj.weight[i:])


def test_row_parallel_bias_is_added_once_and_column_bias_is_split():
    """vLLM's RowParallelLinear adds the bias on rank 0 only, before the all-reduce (MLA o_proj
    with attention_bias); ColumnParallelLinear splits the bias with the rows."""
    g = torch.Generator().manual_seed(7)
    w, b, x = torch.randn(6, 8, generator=g), torch.randn(6, generator=g), torch.randn(3, 8, generator=g)
    counter = Counter()
    rows = [RowLinear(8, 6, Parallel(r, TP, reduce=counter.reduce), "in", bias=True) for r in range(TP)]
    cols = [ColumnLinear(8, 6, Parallel(r, TP), "out", bias=True) for r in range(TP)]
    for r in range(TP):
        for layer in (rows[r], cols[r]):
            holder = torch.nn.Module()
            holder.weight, holder.bias = layer.weight, layer.bias
            load_checkpoint(holder, [("weight", w), ("bias", b)], 1, tp_rank=r, tp_size=TP)
    torch.testing.assert_close(
        sum(m(x[:, 4 * r : 4 * r + 4]) for r, m in enumerate(rows)), x @ w.T + b, rtol=1e-5, atol=1e-6
    )
    assert counter.reduces == TP
    torch.testing.assert_close(torch.cat([m(x) for m in cols], dim=-1), x @ w.T + b, rtol=1e-5, atol=1e-6)


def test_vocabulary_embedding_and_lm_head_split(ref_ckpt):
    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    V, D = t.vocab_size, t.hidden_size

    def load(mod, key, rank=0, size=1):
        holder = torch.nn.Module()
        holder.weight = mod.weight
        load_checkpoint(holder, [("weight", ckpt[key])], 1, tp_rank=rank, tp_size=size)
        return mod

    emb_key, head_key = "model.language_model.embed_tokens.weight", "lm_head.weight"
    counter = Counter()
    embs = [load(VocabEmbedding(V, D, Parallel(r, TP, reduce=counter.reduce)), emb_key, r, TP) for r in range(TP)]
    assert all(e.weight.shape == (V // TP, D) for e in embs)
    ids = torch.tensor([0, 1, V // TP - 1, V // TP, V - 1, 77, 200])
    torch.testing.assert_close(sum(e(ids) for e in embs), ckpt[emb_key][ids], rtol=0, atol=0)
    assert counter.reduces == TP
    h = torch.randn(5, D, generator=torch.Generator().manual_seed(5))
    heads = [load(LMHead(V, D, Parallel(r, TP, gather=lambda x: x)), head_key, r, TP) for r in range(TP)]
    got = torch.cat([hd.logits(h) for hd in heads], dim=-1)
    torch.testing.assert_close(got, (h @ ckpt[head_key].T).float(), rtol=1e-5, atol=1e-6)


def test_shapes_that_do_not_divide_are_refused_naming_size_and_tp(ref_ckpt):
    _, cfg = ref_ckpt
    t = cfg.text_config
    with pytest.raises(
        UnsupportedConfigError, match=r"linear_num_heads \(4\) is not divisible by the tensor-parallel size 3"
    ):
        validate_config(t, tp_size=3)
    with pytest.raises(
        UnsupportedConfigError, match=r"vocab_size \(256\) is not divisible by the tensor-parallel size 3"
    ):
        validate_config(t, tp_size=3)
    validate_config(t, tp_size=TP, expert_parallel=True)  # the tiny config divides at TP 2 + EP
    old = t.n_routed_experts
    try:
        t.n_routed_experts = 6
        with pytest.raises(
            UnsupportedConfigError, match=r"n_routed_experts \(6\) is not divisible by the expert-parallel size 4"
        ):
            validate_config(t, tp_size=4, expert_parallel=True)
        with pytest.raises(
            UnsupportedConfigError, match=r"n_routed_experts \(6\) is not divisible by the expert-parallel size 4"
        ):
            ParallelMoE(t, Parallel(0, 4, True))
    finally:
        t.n_routed_experts = old
    with pytest.raises(
        UnsupportedConfigError, match=r"moe_intermediate_size \(32\) is not divisible by the tensor-parallel size 3"
    ):
        ParallelMoE(t, Parallel(0, 3))
    with pytest.raises(
        UnsupportedConfigError, match=r"vocab_size \(256\) is not divisible by the tensor-parallel size 3"
    ):
        VocabEmbedding(t.vocab_size, t.hidden_size, Parallel(0, 3))


def test_the_published_shapes_divide_at_tp8_with_expert_parallel():
    """transformers' default Glm5NextConfig (the published sizes): TP 8 + EP, as the recipe serves
    it: 8 KDA and 8 MLA heads and 36 of the 288 experts per rank."""
    from transformers import Glm5NextConfig

    t = Glm5NextConfig().text_config
    validate_config(t, tp_size=8, expert_parallel=True)
    assert (t.linear_num_heads // 8, t.num_attention_heads // 8, t.n_routed_experts // 8) == (8, 8, 36)
    with pytest.raises(
        UnsupportedConfigError, match=r"n_routed_experts \(288\) is not divisible by the expert-parallel size 5"
    ):
        validate_config(t, tp_size=5, expert_parallel=True)


# ----------------------------------------------------------------------------- KDA (needs vLLM)


def _kda(cfg, par):
    from glm5_next_hpu.vllm.model import Glm5NextKDA

    fake = SimpleNamespace(
        model_config=None, cache_config=None, compilation_config=SimpleNamespace(static_forward_context={})
    )
    return Glm5NextKDA(cfg.text_config, fake, "kda", par=par)


def _run_kda(layer, x, monkeypatch, lengths):
    """Prefill ``x`` as len(lengths) sequences through the engine-facing core with this rank's
    state slots (shapes from the layer's own get_state_shape); return (output, conv, recurrent)."""
    import glm5_next_hpu.vllm.model as model

    conv_shape, rec_shape = layer.get_state_shape()
    n = len(lengths)
    layer.kv_cache = (torch.zeros(n, *conv_shape), torch.zeros(n, *rec_shape))
    qsl = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    md = SimpleNamespace(
        num_actual_tokens=int(qsl[-1]),
        num_spec_decodes=0,
        non_spec_query_start_loc=qsl,
        non_spec_state_indices_tensor=torch.arange(n),
        num_decodes=0,
        num_prefills=n,
        has_initial_state=torch.zeros(n, dtype=torch.bool),
    )
    ctx = SimpleNamespace(no_compile_layers={layer.prefix: layer}, attn_metadata={layer.prefix: md})
    monkeypatch.setattr(model, "get_forward_context", lambda: ctx)
    with torch.no_grad():
        out = layer(x)
    return out, layer.kv_cache[0], layer.kv_cache[1]


@needs_vllm
def test_kda_heads_conv_and_state_split_across_ranks(ref_ckpt, monkeypatch):
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    from glm5_next_hpu.vllm.model import Glm5NextForConditionalGeneration as C

    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    H, K, W = t.linear_num_heads, t.linear_head_dim, t.linear_conv_kernel_dim
    full, _, c1, _ = _build(lambda par: _kda(cfg, par), ckpt, cfg, 2, "self_attn")
    ranks = [_build(lambda par: _kda(cfg, par), ckpt, cfg, 2, "self_attn", r, TP) for r in range(TP)]
    h = H // TP
    rows_of = lambda r: slice(r * h * K, (r + 1) * h * K)  # noqa: E731
    for r, (m, report, _, part) in enumerate(ranks):
        assert report.loaded_keys == set(part)
        assert m.num_heads == h
        rows = rows_of(r)
        for name in ("q_proj", "k_proj", "v_proj", "f_b_proj", "g_b_proj"):
            assert torch.equal(getattr(m, name).weight, getattr(full, name).weight[rows]), name
        for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
            assert torch.equal(getattr(m, name).weight, getattr(full, name).weight[rows]), name
        assert torch.equal(m.dt_bias, full.dt_bias[rows])
        assert torch.equal(m.A_log, full.A_log[:, :, r * h : (r + 1) * h])  # flat [H] reshaped, then split
        assert torch.equal(m.b_proj.weight, full.b_proj.weight[r * h : (r + 1) * h])
        assert torch.equal(m.o_proj.weight, full.o_proj.weight[:, rows])
        for name in ("f_a_proj", "g_a_proj", "o_norm"):
            assert torch.equal(getattr(m, name).weight, getattr(full, name).weight), name
        # Per-rank state, as vLLM's kda_state_shape gives it for this TP size.
        conv, rec = m.get_state_shape()
        assert rec == (h, K, K) and sorted(conv) == sorted((3 * h * K, W - 1))
    vcfg = SimpleNamespace(
        parallel_config=SimpleNamespace(tensor_parallel_size=TP), model_config=SimpleNamespace(hf_text_config=t)
    )
    assert C.get_mamba_state_shape_from_config(vcfg) == ranks[0][0].get_state_shape()
    x = torch.randn(21, t.hidden_size, generator=torch.Generator().manual_seed(6))
    want, conv1, rec1 = _run_kda(full, x, monkeypatch, [13, 8])
    got = 0
    for r, (m, _, counter, _) in enumerate(ranks):
        out, conv, rec = _run_kda(m, x, monkeypatch, [13, 8])
        got = got + out
        assert counter.reduces == 1  # o_proj's all-reduce
        torch.testing.assert_close(rec, rec1[:, r * h : (r + 1) * h], rtol=1e-5, atol=1e-6)
        # Conv state channels: this rank's q | k | v heads (either of vLLM's conv state layouts).
        ds = (lambda c: c) if is_conv_state_dim_first() else (lambda c: c.transpose(1, 2))
        want_conv = ds(conv1).reshape(2, 3, H * K, W - 1)[:, :, rows_of(r)].reshape(2, 3 * h * K, W - 1)
        torch.testing.assert_close(ds(conv), want_conv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert c1.reduces == 0


@pytest.mark.parametrize("ep", [False, True], ids=["tp2", "tp2-ep"])
def test_static_expert_form_equals_the_gathered_form_on_every_rank(ref_ckpt, ep):
    """The card's form (every local expert on every token, a dense routing matrix: no host sync)
    against the reference form (each expert on its own tokens), rank by rank, with tokens routed to
    other ranks' experts in the batch."""
    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    make = lambda par: ParallelMoE(t, par)  # noqa: E731
    g = torch.Generator().manual_seed(5)
    x = torch.randn(29, t.hidden_size, generator=g)
    ids = torch.randint(0, t.n_routed_experts, (29, t.num_experts_per_tok), generator=g)
    weights = torch.rand(29, t.num_experts_per_tok, generator=g)
    for r in range(TP):
        experts = _build(make, ckpt, cfg, 1, "mlp", r, TP, ep)[0].experts
        want = experts.forward_gather(x, weights, ids)
        torch.testing.assert_close(experts.forward_static(x, weights, ids), want, rtol=1e-5, atol=1e-6)
        assert want.abs().sum() > 0  # this rank's experts were reached
        # an off-by-one in the routing matrix is seen
        shifted = experts.forward_static(x, weights, (ids + 1) % t.n_routed_experts)
        assert not torch.allclose(shifted, want, atol=1e-4)


def _run_kda_gaudi(layer, x_padded, monkeypatch, lengths, L, state=None, is_prompt=True, init=None):
    """The same core on vllm-gaudi's contract: one metadata object, requests padded to ``L`` tokens,
    a 2-D state index tensor picked by the layer's cache group, a padded request on slot -1."""
    import glm5_next_hpu.vllm.model as model

    conv_shape, rec_shape = layer.get_state_shape()
    n = len(lengths)
    if state is None:  # n request slots and the spare last row that padded requests write to
        state = (torch.zeros(n + 1, *conv_shape), torch.zeros(n + 1, *rec_shape))
    layer.kv_cache = state
    layer.cache_group_idx = torch.tensor([1])
    rows = torch.tensor([[5] * (n + 1), list(range(n)) + [-1]])  # group 1 is this layer's
    mask = torch.zeros(n + 1, L)
    for i, k in enumerate(lengths):
        mask[i, :k] = 1
    md = SimpleNamespace(
        is_prompt=is_prompt,
        load_indices_tensor=rows,
        store_indices_tensor=rows,
        padding_mask_flat=mask.view(-1, 1) if is_prompt else None,
        has_initial_states_p=init if is_prompt else None,
    )
    ctx = SimpleNamespace(no_compile_layers={layer.prefix: layer}, attn_metadata=md)
    monkeypatch.setattr(model, "get_forward_context", lambda: ctx)
    with torch.no_grad():
        out = layer(x_padded)
    return out, layer.kv_cache


@needs_vllm
def test_kda_on_vllm_gaudis_contract_equals_vllms(ref_ckpt, monkeypatch):
    """The real KDA layer: prefill of two requests and a decode step on vllm-gaudi's padded,
    one-object metadata give vLLM's outputs and states (the state slots, the conv tail before the
    padding, a padded request that leaves every real slot alone)."""
    ckpt, cfg = ref_ckpt
    layer = _build(lambda par: _kda(cfg, par), ckpt, cfg, 2, "self_attn")[0]
    lengths, L = [13, 8], 16
    x = torch.randn(21, cfg.text_config.hidden_size, generator=torch.Generator().manual_seed(6))
    want, conv1, rec1 = _run_kda(layer, x, monkeypatch, lengths)
    xp = torch.zeros(3 * L, x.shape[1])
    xp[0:13], xp[L : L + 8] = x[:13], x[13:]
    xp[2 * L :] = torch.randn(L, x.shape[1])  # the padded request's rows: must not leak
    got, (conv, rec) = _run_kda_gaudi(layer, xp, monkeypatch, lengths, L, init=torch.zeros(3, dtype=torch.int32))
    torch.testing.assert_close(got[0:13], want[:13], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[L : L + 8], want[13:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rec[:2], rec1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(conv[:2], conv1, rtol=1e-5, atol=1e-6)
    # a decode step from those states, vLLM's contract against vllm-gaudi's
    import glm5_next_hpu.vllm.model as model

    t1 = torch.randn(2, x.shape[1], generator=torch.Generator().manual_seed(7))
    layer.kv_cache = (conv1.clone(), rec1.clone())
    md = SimpleNamespace(
        num_actual_tokens=2,
        num_spec_decodes=0,
        non_spec_query_start_loc=torch.tensor([0, 1, 2]),
        non_spec_state_indices_tensor=torch.arange(2),
        num_decodes=2,
        num_prefills=0,
        has_initial_state=None,
    )
    monkeypatch.setattr(
        model,
        "get_forward_context",
        lambda: SimpleNamespace(no_compile_layers={layer.prefix: layer}, attn_metadata={layer.prefix: md}),
    )
    with torch.no_grad():
        want_d = layer(t1)
    rec_d = layer.kv_cache[1].clone()
    state = (torch.cat([conv1, torch.zeros_like(conv1[:1])]), torch.cat([rec1, torch.zeros_like(rec1[:1])]))
    td = torch.cat([t1, torch.randn(1, x.shape[1])])
    got_d, (_, rec_g) = _run_kda_gaudi(layer, td, monkeypatch, [1, 1], 1, state=state, is_prompt=False)
    torch.testing.assert_close(got_d[:2], want_d, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rec_g[:2], rec_d, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- routed experts at rest in FP8

FP8_SPEC_QC = {"quant_method": "fp8", "weight_block_size": [16, 16], "modules_to_not_convert": ["mlp.gate"]}
PLACEMENTS = [(0, 1, False), (0, TP, False), (1, TP, False), (0, TP, True), (1, TP, True)]
PLACEMENT_IDS = ["tp1", "tp2-rank0", "tp2-rank1", "tp2-ep-rank0", "tp2-ep-rank1"]


def _fp8_moe_stream(ckpt, spec):
    """Layer 1's MoE as the release stores it: every projection but the router in block FP8."""
    from glm5_next_hpu.vllm.fp8 import quantize_block_fp8

    prefix, stream = f"{LAYERS}.1.mlp.", []
    for k, v in ckpt.items():
        if k.startswith(prefix) and k.endswith(".weight") and ".mlp.gate." not in k:
            q, sc = quantize_block_fp8(v, spec.block)
            stream += [(k, q), (k + "_scale_inv", sc)]
        elif k.startswith(prefix):
            stream.append((k, v))
    return stream


def _fp8_moe(t, stream, spec, rank, size, ep, at_rest=True):
    """The MoE built as the model builds it for a block-FP8 checkpoint (``at_rest``), or as before
    (experts dequantized at load), loaded from ``stream``."""
    par = Parallel(rank, size, ep, reduce=lambda x: x)  # the rank's partial sum
    m = ParallelMoE(t, par, prefix=f"{LAYERS}.1.mlp", fp8_spec=spec if at_rest else None)
    report = load_checkpoint(_under(1, "mlp", m), stream, t.num_hidden_layers, tp_rank=rank, tp_size=size, fp8=spec)
    return m, report


@pytest.mark.parametrize("rank,size,ep", PLACEMENTS, ids=PLACEMENT_IDS)
def test_fp8_experts_at_rest_hold_the_checkpoints_bytes_and_scales(ref_ckpt, rank, size, ep):
    """The experts' parameters are e4m3 + fp32 block scales holding the checkpoint's bytes, narrowed
    to the rank's experts or intermediate slice (no dequantize-requantize), every byte counted once."""
    from glm5_next_hpu.vllm.fp8 import FP8_DTYPE, BlockFp8Spec

    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    spec = BlockFp8Spec.from_quantization_config(FP8_SPEC_QC)
    stream = _fp8_moe_stream(ckpt, spec)
    m, report = _fp8_moe(t, stream, spec, rank, size, ep)
    ex = m.experts
    E, inter, D = t.n_routed_experts, t.moe_intermediate_size, t.hidden_size
    n, i = (E // size, inter) if ep else (E, inter // size)
    assert (ex.w13_weight.dtype, ex.w2_weight.dtype) == (FP8_DTYPE, FP8_DTYPE)
    assert ex.w13_weight_scale_inv.dtype == ex.w2_weight_scale_inv.dtype == torch.float32
    assert tuple(ex.w13_weight_scale_inv.shape) == (n, 2 * i // 16, D // 16)
    assert tuple(ex.w2_weight_scale_inv.shape) == (n, D // 16, i // 16)
    src = dict(stream)
    bits = lambda w: w.view(torch.uint8)  # noqa: E731  (byte equality: e4m3 NaN-free compare)
    first = rank * n if ep else 0
    rows = slice(0, inter) if ep else slice(rank * i, (rank + 1) * i)
    for e in range(n):
        key = f"{LAYERS}.1.mlp.experts.{first + e}"
        for proj, w, s, half in (
            ("gate_proj", ex.w13_weight, ex.w13_weight_scale_inv, 0),
            ("up_proj", ex.w13_weight, ex.w13_weight_scale_inv, 1),
        ):
            cw, cs = src[f"{key}.{proj}.weight"], src[f"{key}.{proj}.weight_scale_inv"]
            assert torch.equal(bits(w[e, half * i : (half + 1) * i]), bits(cw[rows])), proj
            sr = slice(rows.start // 16, rows.stop // 16)
            assert torch.equal(s[e, half * i // 16 : (half + 1) * i // 16], cs[sr]), proj
        cw, cs = src[f"{key}.down_proj.weight"], src[f"{key}.down_proj.weight_scale_inv"]
        assert torch.equal(bits(ex.w2_weight[e]), bits(cw[:, rows]))
        assert torch.equal(ex.w2_weight_scale_inv[e], cs[:, rows.start // 16 : rows.stop // 16])
    expert_keys = {k for k, _ in stream if ".experts." in k}
    mine = {k for k in expert_keys if not ep or int(k.split(".experts.")[1].split(".")[0]) // n == rank}
    assert {k for k in report.loaded_keys if ".experts." in k} == mine  # weights and scales, each once
    assert set(report.other_rank_keys) == expert_keys - mine  # EP: the other rank's weights and scales
    # every expert pair is checked raw (another rank's too, before it is set aside), none dequantized
    assert {k for k in report.fp8_raw if ".experts." in k} == {k for k in expert_keys if k.endswith(".weight")}
    assert not [k for k in report.fp8_dequantized if ".experts." in k]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank,size,ep", PLACEMENTS, ids=PLACEMENT_IDS)
def test_fp8_experts_at_rest_compute_bit_for_bit_what_dequantizing_at_load_does(ref_ckpt, rank, size, ep, dtype):
    """Dequantizing a chunk right before its matmul is the load-time dequantization's arithmetic, so
    both expert forms, and the MoE, give the same bits as experts dequantized at load."""
    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec

    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    spec = BlockFp8Spec.from_quantization_config(FP8_SPEC_QC)
    stream = _fp8_moe_stream(ckpt, spec)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as vLLM builds the model: the model dtype is the default dtype
    try:
        rest, _ = _fp8_moe(t, stream, spec, rank, size, ep)
        at_load, _ = _fp8_moe(t, stream, spec, rank, size, ep, at_rest=False)
    finally:
        torch.set_default_dtype(old)
    assert at_load.experts.w13_weight.dtype == dtype and rest.experts.fp8_block == (16, 16)
    g = torch.Generator().manual_seed(7)
    T, k = 29, t.num_experts_per_tok
    x = torch.randn(T, t.hidden_size, generator=g).to(dtype)
    ids = torch.randint(0, t.n_routed_experts, (T, k), generator=g)
    weights = torch.rand(T, k, generator=g)
    for form in ("forward_static", "forward_gather"):
        got = getattr(rest.experts, form)(x, weights, ids)
        want = getattr(at_load.experts, form)(x, weights, ids)
        assert got.dtype == dtype and torch.equal(got, want), form
        assert want.abs().sum() > 0, form  # this rank's experts were reached
    assert torch.equal(rest(x), at_load(x))


def test_fp8_expert_scale_missing_is_refused_naming_the_key(ref_ckpt):
    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec, Fp8CheckpointError

    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    spec = BlockFp8Spec.from_quantization_config(FP8_SPEC_QC)
    gone = f"{LAYERS}.1.mlp.experts.3.up_proj.weight_scale_inv"
    stream = [(k, v) for k, v in _fp8_moe_stream(ckpt, spec) if k != gone]
    with pytest.raises(Fp8CheckpointError, match=rf"{gone[: -len('_scale_inv')]}: FP8 weight without its scale"):
        _fp8_moe(t, stream, spec, 0, 1, False)
    # a BF16 expert weight where the experts are held in FP8 is refused, naming it
    key = f"{LAYERS}.1.mlp.experts.2.down_proj.weight"
    stream = [(k, ckpt[key] if k == key else v) for k, v in _fp8_moe_stream(ckpt, spec) if k != key + "_scale_inv"]
    with pytest.raises(Exception, match=rf"{key}: checkpoint dtype torch.float32 into parameter .*w2_weight"):
        _fp8_moe(t, stream, spec, 0, 1, False)


def test_fp8_expert_slice_off_the_block_grid_is_refused_naming_the_parameter(ref_ckpt):
    """TP 2 gives each rank 16 of the 32 intermediate rows: with 32-row blocks a rank's slice would
    split a block, so the stacked scales could not be the checkpoint's blocks."""
    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec

    t = ref_ckpt[1].text_config
    spec = BlockFp8Spec.from_quantization_config({**FP8_SPEC_QC, "weight_block_size": [32, 32]})
    ParallelMoE(t, Parallel(0, 1, False), prefix="m", fp8_spec=spec)  # TP 1: 32 rows, one block
    with pytest.raises(UnsupportedConfigError, match=r"w13_weight: this rank's moe_intermediate_size slice \(16"):
        ParallelMoE(t, Parallel(0, TP, False), prefix="m", fp8_spec=spec)


def test_clamp_binding_rate_is_counted_from_the_routed_gate_and_up_values(ref_ckpt):
    """The counts are the routed pairs' gate / up values against the limit, recomputed here from the
    dequantized weights; moving the limit moves them (they are measured, not constants)."""
    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec
    from glm5_next_hpu.vllm.parallel import dequantize_blocks

    ckpt, cfg = ref_ckpt
    t = cfg.text_config
    spec = BlockFp8Spec.from_quantization_config(FP8_SPEC_QC)
    moe, _ = _fp8_moe(t, _fp8_moe_stream(ckpt, spec), spec, 0, 1, False)
    x = torch.randn(23, t.hidden_size, generator=torch.Generator().manual_seed(11))
    ids = moe.gate(x)[1]
    w13 = dequantize_blocks(moe.experts.w13_weight, moe.experts.w13_weight_scale_inv, spec.block, x.dtype)
    h = torch.einsum("td,tkid->tki", x, w13[ids])  # [T, k, 2I], every routed pair
    gate, up = h.chunk(2, dim=-1)
    for limit in (0.05, 0.2, moe.experts.limit):
        moe.experts.limit = limit
        got = moe.clamp_binding(x)
        assert got["values"] == ids.numel() * t.moe_intermediate_size
        assert got["gate_above"] == int((gate > limit).sum()) and got["up_outside"] == int((up.abs() > limit).sum())
        # the static, sync-free form counts the same (the probe of the emulated runner test uses it)
        assert moe.clamp_binding_counts(x).tolist() == [got["gate_above"], got["up_outside"], got["values"]]
    moe.experts.limit = 0.05
    small = moe.clamp_binding(x)
    moe.experts.limit = 1e9
    assert small["gate_above"] > 0 and small["up_outside"] > 0 and moe.clamp_binding(x)["up_outside"] == 0


# ----------------------------------------------------------------------------- GLM5_NEXT_MOE_OP=fused refusals


@needs_vllm
def test_fused_moe_op_is_refused_where_vllm_gaudis_op_cannot_take_the_experts(ref_ckpt):
    """GLM5_NEXT_MOE_OP=fused stops the layer at construction, naming the switch and the reason: no
    block-FP8 config (an unquantized checkpoint), experts kept unquantized by modules_to_not_convert,
    a hidden size off the block grid. The checks come before any vLLM layer is built (none runs here)."""
    import copy

    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec
    from glm5_next_hpu.vllm.fused_moe import layer_op

    t = ref_ckpt[1].text_config
    qc = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]})
    spec = BlockFp8Spec.from_quantization_config(FP8_SPEC_QC)
    prefix, par = f"{LAYERS}.1.mlp", Parallel(0, 1, False)
    switch = r"^GLM5_NEXT_MOE_OP=fused: "
    with pytest.raises(UnsupportedConfigError, match=switch + r".*no block-FP8 quantization config reached the layer"):
        ParallelMoE(t, par, None, prefix, None, moe_op="fused")
    kept = BlockFp8Spec.from_quantization_config({**FP8_SPEC_QC, "modules_to_not_convert": [f"{prefix}.experts"]})
    with pytest.raises(
        UnsupportedConfigError, match=switch + r".*experts is kept unquantized by .*modules_to_not_convert"
    ):
        ParallelMoE(t, par, qc, prefix, kept, moe_op="fused")
    wide = copy.copy(t)
    wide.hidden_size = 40  # the intermediate size (32) still splits into 16-blocks; the hidden size does not
    with pytest.raises(UnsupportedConfigError, match=switch + r".*hidden_size 40 is not a multiple of the FP8 block"):
        ParallelMoE(wide, par, qc, prefix, spec, moe_op="fused")
    # the exact path takes all three (the same layers, the port's loop), and so does auto (the
    # default: the fused op where a layer can take it), without a refusal
    for args in ((t, par, None, prefix, None), (t, par, None, prefix, kept), (wide, par, None, prefix, spec)):
        assert ParallelMoE(*args).experts.op == "exact"
        assert ParallelMoE(*args, moe_op="auto").experts.op == "exact"
    # a layer the op can take: auto and fused put it on the op, exact keeps the loop
    assert [layer_op(v, prefix, qc, spec, False, t.hidden_size) for v in ("auto", "fused", "exact")] == [
        "fused",
        "fused",
        "exact",
    ]


@needs_vllm
def test_fused_moe_op_is_refused_off_hpu_and_without_vllms_block_fp8_config():
    """The model-level check (run in the model's constructor): the HPU platform and vLLM's block
    Fp8Config, else the switch and the reason."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from glm5_next_hpu.vllm.fused_moe import check_model

    qc = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]})
    per_tensor = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic"})
    cpu, hpu = SimpleNamespace(device_type="cpu"), SimpleNamespace(device_type="hpu")
    with pytest.raises(
        UnsupportedConfigError, match=r"^GLM5_NEXT_MOE_OP=fused: .*HPU platform only, and this is the 'cpu'"
    ):
        check_model(cpu, qc)
    with pytest.raises(UnsupportedConfigError, match=r"^GLM5_NEXT_MOE_OP=fused: the checkpoint is not quantized"):
        check_model(hpu, None)
    with pytest.raises(
        UnsupportedConfigError, match=r"^GLM5_NEXT_MOE_OP=fused: quantization 'fp8' is not vLLM's block"
    ):
        check_model(hpu, per_tensor)
    check_model(hpu, qc)  # accepted: HPU with a block-FP8 checkpoint


@needs_vllm
def test_the_default_expert_path_is_fused_where_vllm_gaudis_op_can_run():
    """GLM5_NEXT_MOE_OP unset (auto) resolves, at model construction, to the fused op's per-layer
    choice on the HPU platform with vLLM's block Fp8Config (the serving page's deployment), and to
    the exact loop on CPU and for a checkpoint the op cannot take, without a refusal; an explicit
    value is kept (fused checked as above)."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from glm5_next_hpu.vllm.fused_moe import resolve

    qc = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]})
    per_tensor = Fp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic"})
    cpu, hpu = SimpleNamespace(device_type="cpu"), SimpleNamespace(device_type="hpu")
    assert resolve("auto", hpu, qc) == "auto"
    assert [resolve("auto", *where) for where in ((cpu, qc), (hpu, None), (hpu, per_tensor))] == ["exact"] * 3
    assert resolve("exact", hpu, qc) == "exact" and resolve("fused", hpu, qc) == "fused"
    with pytest.raises(UnsupportedConfigError, match=r"^GLM5_NEXT_MOE_OP=fused: .*this is the 'cpu'"):
        resolve("fused", cpu, qc)
