"""glm5_hpu.placement_fit: routing statistics from the model's own router, a fit that evens out
the busiest expert group, and the command that writes a file placement.py loads.

* the fit, on synthetic counts: the optimum (an independent brute force) on small cases; the
  exchange heuristic alone never worse than the checkpoint's order and within its stated bound
  (total/G + largest - smallest count) at the real model's size; always a permutation cut into
  equal groups;
* the statistics, on the tiny checkpoint (made by transformers 5.23.0, converted by the
  converter): every MoE layer counts tokens x top_k assignments, and the counts equal those of
  transformers' whole GlmMoeDsaForCausalLM (float32, experts holding the converter's
  dequantization, its router's top-k hooked); the MTP layer's equal those of transformers'
  decoder layer fed as vLLM's DeepSeekMTP feeds it;
* the command, end to end on the tiny checkpoint: the file placement.py loads, before and
  after printed, after <= before; bad input refused naming the file, exit 2.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from glm5_hpu import placement, placement_fit
from glm5_hpu.placement_fit import Checkpoint, FitError, collect, fit, group_loads, main
from packtests import glm_moe_dsa_tiny


# ------------------------------------------------------------------------------------ the fit
def _optimum(counts, n_groups):
    """The least busiest-group load over every grouping: the first remaining expert opens the
    next group, its companions every combination of the rest (independent of the fitter)."""
    k = len(counts) // n_groups

    def best(rest):
        if not rest:
            return 0
        first, others = rest[0], rest[1:]
        out = None
        for mates in itertools.combinations(others, k - 1):
            load = counts[first] + sum(counts[e] for e in mates)
            left = [e for e in others if e not in mates]
            worst = max(load, best(left))
            out = worst if out is None else min(out, worst)
        return out

    return best(list(range(len(counts))))


def _counts(n, seed, kind):
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        return torch.randint(0, 100, (n,), generator=g).tolist()
    if kind == "skewed":  # a few hot experts, as routing tends to be
        return (torch.rand(n, generator=g) ** 4 * 1000).long().tolist()
    return (torch.randint(0, 3, (n,), generator=g) * 7).tolist()  # many ties


def _is_placement(order, n):
    assert sorted(order) == list(range(n))


SMALL = [(8, 4), (8, 2), (6, 3), (9, 3), (12, 3), (12, 4), (12, 2), (10, 5)]


@pytest.mark.parametrize("n,g", SMALL)
def test_the_fit_is_the_optimum_on_small_cases(n, g):
    for seed, kind in itertools.product(range(4), ("uniform", "skewed", "ties")):
        counts = _counts(n, seed, kind)
        f = fit(counts, g)
        _is_placement(f.order, n)
        assert f.exact
        assert f.after == _optimum(counts, g), (counts, f)
        assert f.after == max(group_loads(counts, f.order, g)) and f.before == max(group_loads(counts, range(n), g))
        assert f.after <= f.before and f.total == sum(counts)


@pytest.mark.parametrize("n,g", SMALL)
def test_the_exchange_heuristic_alone_is_never_worse_than_the_checkpoints_order_and_within_its_bound(n, g):
    gaps = []
    for seed, kind in itertools.product(range(4), ("uniform", "skewed", "ties")):
        counts = _counts(n, seed, kind)
        f = fit(counts, g, exact_limit=0)
        _is_placement(f.order, n)
        assert not f.exact
        assert f.after <= f.before
        assert f.after <= f.ideal + max(counts) - min(counts)
        best = _optimum(counts, g)
        assert f.after >= best >= f.lower_bound
        assert f.how().startswith("optimal: at the lower bound" if f.after == f.lower_bound else "exchange: ")
        gaps.append((f.after - best) / f.ideal)
    # measured here: over these 96 cases the exchange heuristic alone misses the optimum in 3, by
    # at most 0.45 % of the ideal; the exact search (the default at these sizes) closes that
    assert max(gaps) <= 0.01


@pytest.mark.parametrize("kind", ["uniform", "skewed"])
def test_at_the_real_models_size_the_fit_reaches_the_lower_bound(kind):
    """256 experts in 4 groups (the recipe's EP 4 x TP 2): too many groupings to search, and the
    exchange fit reaches ceil(total/4), so it is optimal and says so."""
    for seed in range(3):
        counts = _counts(256, seed, kind)
        f = fit(counts, 4)
        _is_placement(f.order, 256)
        assert not f.exact and f.after <= f.before
        assert f.after == f.lower_bound == -(-sum(counts) // 4) and f.optimal
        assert f.how() == "optimal: at the lower bound"


def test_edge_cases_of_the_fit():
    assert fit([5, 1, 1, 5], 2).after == 6  # identity [5,1],[1,5] is already optimal
    assert fit([5, 1, 1, 5], 2).before == 6
    hot = [0] * 7 + [100]
    assert fit(hot, 4).after == 100  # one expert takes everything: its group carries it
    assert fit([0] * 8, 4).order == list(range(8))
    assert fit([3, 9, 4, 1], 1).order == [0, 1, 2, 3] and fit([3, 9, 4, 1], 1).after == 17
    f = fit([9, 8, 1, 0, 7, 2, 3, 4], 4)  # groups listed in ascending ids, by their smallest id
    groups = [f.order[i : i + 2] for i in range(0, 8, 2)]
    assert all(a < b for a, b in groups) and [g[0] for g in groups] == sorted(g[0] for g in groups)
    with pytest.raises(FitError, match="8 experts do not split into 3 equal expert groups"):
        fit([1] * 8, 3)
    with pytest.raises(FitError, match="an expert count is negative"):
        fit([1, -1, 2, 3], 2)


# ---------------------------------------------------------------------- the tiny checkpoint
PROMPTS = [5, 17, 40, 1, 63, 9]


def _prompts():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(1, 256, (n,), generator=g).tolist() for n in PROMPTS]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from glm5_mxfp4 import convert

    src = glm_moe_dsa_tiny.make(str(tmp_path_factory.mktemp("src") / "GLM-tiny-BF16"))
    _vary_norms(src)
    dst = tmp_path_factory.mktemp("dst") / "GLM-tiny-MXFP4"
    assert convert.main([src, str(dst), "--quiet"]) == 0
    return src, dst


def _vary_norms(src):
    """Norm weights other than 1 (the tiny model is saved with ones), so a norm left out or
    applied twice, or one norm's weight used for another (the MTP's enorm, hnorm, the final
    norm before them), changes the routing."""
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(3)
    for shard in sorted(Path(src).glob("*.safetensors")):
        tensors = load_file(str(shard))
        names = [k for k in tensors if k.endswith("norm.weight")]
        for k in names:
            tensors[k] = (0.5 + torch.rand(tensors[k].shape, generator=g)).to(tensors[k].dtype)
        if names:
            save_file(tensors, str(shard), metadata={"format": "pt"})


def _dequantized(dst, layers):
    """transformers' experts of ``layers`` set to the converter's dequantization of dst."""
    from glm5_hpu.moe_mxfp4 import MxfpExperts

    ckpt = Checkpoint(dst, "float32")
    with torch.no_grad():
        for layer, experts in layers.items():
            for e in range(experts.num_experts):
                w13, w2 = MxfpExperts.from_checkpoint(ckpt.tensor, f"model.layers.{layer}.mlp", [e]).weights(
                    e, torch.float32
                )
                experts.gate_up_proj[e] = w13
                experts.down_proj[e] = w2


def _counting(gate, counts, layer, n_experts):
    def hook(module, args, out):
        counts[layer] = counts.get(layer, torch.zeros(n_experts, dtype=torch.int64)) + torch.bincount(
            out[2].flatten(), minlength=n_experts
        )

    return gate.register_forward_hook(hook)


def test_every_moe_layer_counts_tokens_times_top_k(tiny):
    ckpt = Checkpoint(tiny[1])
    cfg = ckpt.config
    routing = collect(ckpt, _prompts(), sparse=True)
    assert sorted(routing.counts) == placement.moe_layers(cfg) == [1, 2, 3]  # 3: the MTP layer
    assert routing.tokens == {1: sum(PROMPTS), 2: sum(PROMPTS), 3: sum(n - 1 for n in PROMPTS)}
    for layer, counts in routing.counts.items():
        assert (
            len(counts) == 8
            and sum(counts) == routing.tokens[layer] * cfg.num_experts_per_tok == routing.tokens[layer] * 2
        )


def _reference(src, dst):
    """transformers' GlmMoeDsaForCausalLM, float32, eager, its experts the converter's
    dequantization of dst, and its indexer keeping every key: dense attention, which is what the
    fitter runs (GLM_DSA_SPARSE=1: the top-k applies above 32,768 keys only). transformers
    applies the top-k from index_topk (8 here) on; the tiny model's indexer scores tie at zero
    (relu) at that boundary and transformers' topk and the port's stable sort break such ties
    differently (glm5_hpu/dsa.py), so the sparse path is compared in test_glm5_hpu_dsa.py, with
    weights that do not tie."""
    from transformers import GlmMoeDsaForCausalLM

    model = GlmMoeDsaForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    model.config._experts_implementation = "eager"
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = model.config.max_position_embeddings
    moe = {i: layer.mlp for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")}
    _dequantized(dst, {i: m.experts for i, m in moe.items()})
    return model, moe


def test_the_counts_are_transformers_routing(tiny):
    """float32: the per-layer counts of the port's layer-by-layer forward equal those hooked on
    transformers' whole model run one sequence at a time."""
    src, dst = tiny
    prompts = _prompts()
    ckpt = Checkpoint(dst, "float32")
    ours = collect(ckpt, prompts, sparse=True)
    model, moe = _reference(src, dst)
    theirs: dict = {}
    hooks = [_counting(m.gate, theirs, i, 8) for i, m in moe.items()]
    with torch.no_grad():
        for p in prompts:
            model.model(input_ids=torch.tensor([p]))
    for h in hooks:
        h.remove()
    assert sorted(theirs) == [1, 2]
    for layer in (1, 2):
        assert ours.counts[layer] == theirs[layer].tolist(), layer
    # the DSA rule reaches the attention: the top-k from 8 keys on routes otherwise
    assert collect(ckpt, prompts, sparse=True, threshold=8).counts != ours.counts


def test_the_mtp_layer_is_fed_as_vllms_deepseek_mtp_feeds_it(tiny):
    """transformers has no MTP: its decoder layer, built for layer index 3 and holding the MTP
    layer's tensors, fed eh_proj(cat(enorm(embedding of token p+1, zero at p=0), hnorm(final
    hidden state at p))) over positions 0..T-2, counts what the fitter counts."""
    from safetensors import safe_open
    from transformers import GlmMoeDsaConfig
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (
        GlmMoeDsaDecoderLayer,
        GlmMoeDsaRMSNorm,
        GlmMoeDsaRotaryEmbedding,
    )

    src, dst = tiny
    prompts = _prompts()
    ours = collect(Checkpoint(dst, "float32"), prompts, sparse=True)
    model, _ = _reference(src, dst)

    data = json.loads((dst / "config.json").read_text())
    data.pop("quantization_config")
    cfg = GlmMoeDsaConfig.from_dict(
        {
            **data,
            "num_hidden_layers": 4,
            "mlp_layer_types": ["dense"] + ["sparse"] * 3,
            "indexer_types": ["full"] * 4,
            "layer_types": ["indexed_attention"] * 4,
        }
    )
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    mtp = GlmMoeDsaDecoderLayer(cfg, 3).eval()
    mtp.self_attn.indexer.index_topk = cfg.max_position_embeddings  # dense, as _reference
    with open(f"{src}/model.safetensors.index.json") as f:
        index = json.load(f)["weight_map"]

    def get(key):
        with safe_open(f"{src}/{index[key]}", "pt") as f:
            return f.get_tensor(key).float()

    state = {
        k[len("model.layers.3.") :]: get(k) for k in index if k.startswith("model.layers.3.") and ".experts." not in k
    }
    norms = {n: GlmMoeDsaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for n in ("enorm", "hnorm")}
    for n, m in norms.items():
        m.weight.data = state.pop(f"{n}.weight")
    eh_proj = state.pop("eh_proj.weight")
    state = {k: v for k, v in state.items() if not k.startswith("shared_head.")}
    loaded = mtp.load_state_dict(state, strict=False)
    assert loaded.unexpected_keys == [] and all(".experts." in k for k in loaded.missing_keys)
    _dequantized(dst, {3: mtp.mlp.experts})
    theirs: dict = {}
    _counting(mtp.mlp.gate, theirs, 3, 8)
    rotary = GlmMoeDsaRotaryEmbedding(cfg)
    with torch.no_grad():
        for p in prompts:
            if len(p) < 2:
                continue
            t = len(p) - 1
            final = model.model(input_ids=torch.tensor([p])).last_hidden_state[:, :-1]  # after the final norm
            emb = model.model.embed_tokens(torch.tensor([p[1:]]))
            emb[:, 0] = 0
            x = torch.nn.functional.linear(torch.cat([norms["enorm"](emb), norms["hnorm"](final)], -1), eh_proj)
            pos = torch.arange(t)[None]
            mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
            mtp(x, attention_mask=mask, position_ids=pos, position_embeddings=rotary(x, pos))
    assert ours.counts[3] == theirs[3].tolist()


# ------------------------------------------------------------------------------- the command
@pytest.fixture
def clean_env(monkeypatch):
    for name in ("GLM_DSA_SPARSE", "GLM_MOE_TP", "GLM_MOE_PLACEMENT"):
        monkeypatch.delenv(name, raising=False)


def _jsonl(path, items):
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


ROW = re.compile(r"^\s+(\d+)( MTP)?\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(.*)$", re.M)


def test_the_command_writes_a_file_placement_loads_with_before_and_after(tiny, tmp_path, capsys, clean_env):
    dst = tiny[1]
    prompts = _jsonl(tmp_path / "prompts.jsonl", _prompts())
    out, counts_out = tmp_path / "fitted.json", tmp_path / "counts.json"
    assert (
        main(
            [
                str(dst),
                "--prompts",
                str(prompts),
                "--cards",
                "8",
                "--moe-tp",
                "2",
                "--out",
                str(out),
                "--counts-out",
                str(counts_out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    print(text)
    cfg = Checkpoint(dst).config
    loaded = placement.load(out, cfg)
    assert sorted(loaded.layers) == [1, 2, 3]
    assert "4 expert groups (8 cards, GLM_MOE_TP=2) of 2 experts" in text
    routing = placement_fit.load_routing(counts_out, cfg)
    rows = {int(m[0]): m for m in ROW.findall(text)}
    assert sorted(rows) == [1, 2, 3] and rows[3][1] == " MTP"
    for layer, (_, _, tokens, total, largest, before, after, ideal, how) in rows.items():
        counts = routing.counts[layer]
        assert int(tokens) == routing.tokens[layer] and int(total) == sum(counts) and int(largest) == max(counts)
        assert int(before) == max(group_loads(counts, range(8), 4))
        assert int(after) == max(group_loads(counts, loaded.order(layer), 4))  # the file's order
        assert int(after) <= int(before) and float(ideal) == sum(counts) / 4
        assert how == "optimal: searched all 105 groupings"
    assert any(int(r[6]) < int(r[5]) for r in rows.values())  # the fit changed something
    body = json.loads(out.read_text())
    assert "8 cards, GLM_MOE_TP=2" in body["note"] and not list(tmp_path.glob(".fitted.json.*"))  # no temporary left
    # a refit from the counts for another layout, without the model
    again = tmp_path / "two.json"
    assert main([str(dst), "--counts", str(counts_out), "--groups", "2", "--out", str(again)]) == 0
    assert "2 expert groups (--groups) of 4 experts" in capsys.readouterr().out
    assert sorted(placement.load(again, cfg).layers) == [1, 2, 3]


def test_glm_moe_tp_from_the_environment_sets_the_groups(tiny, tmp_path, capsys, monkeypatch, clean_env):
    counts = tmp_path / "counts.json"
    assert (
        main(
            [
                str(tiny[1]),
                "--prompts",
                str(_jsonl(tmp_path / "p.jsonl", _prompts()[:2])),
                "--out",
                str(tmp_path / "a.json"),
                "--counts-out",
                str(counts),
            ]
        )
        == 0
    )
    assert "8 expert groups (8 cards, GLM_MOE_TP=1) of 1 experts" in capsys.readouterr().out
    monkeypatch.setenv("GLM_MOE_TP", "2")
    assert main([str(tiny[1]), "--counts", str(counts), "--out", str(tmp_path / "b.json")]) == 0
    assert "4 expert groups (8 cards, GLM_MOE_TP=2)" in capsys.readouterr().out


def test_text_prompts_go_through_the_checkpoints_tokenizer(tiny, tmp_path, capsys, clean_env):
    """A string line is the checkpoint's tokenizer's ids: the same counts as the ids themselves."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    dst = tmp_path / "ckpt"
    shutil.copytree(tiny[1], dst)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(dst / "tokenizer.json"))
    ids = _prompts()[:3]
    texts = _jsonl(tmp_path / "t.jsonl", [" ".join(f"w{i}" for i in p) for p in ids])
    assert (
        main(
            [
                str(dst),
                "--prompts",
                str(texts),
                "--out",
                str(tmp_path / "t.json"),
                "--counts-out",
                str(tmp_path / "tc.json"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                str(dst),
                "--prompts",
                str(_jsonl(tmp_path / "i.jsonl", ids)),
                "--out",
                str(tmp_path / "i.json"),
                "--counts-out",
                str(tmp_path / "ic.json"),
            ]
        )
        == 0
    )
    a, b = (json.loads((tmp_path / n).read_text())["layers"] for n in ("tc.json", "ic.json"))
    assert a == b


def _bad(tiny, tmp_path):
    """name -> (argv, the message's pattern); the file each names is in the message."""
    dst = tiny[1]
    good = _jsonl(tmp_path / "good.jsonl", [[1, 2, 3]])
    bf16 = tmp_path / "bf16"
    shutil.copytree(tiny[0], bf16)
    noshard = tmp_path / "noshard"
    shutil.copytree(dst, noshard)
    (noshard / "model-00002-of-00005.safetensors").unlink()
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"model_type": "llama"}')
    out = ["--out", str(tmp_path / "o.json")]
    lines = {
        "not json": "[1, 2",
        "a dict": '{"ids": [1]}',
        "out of range": "[1, 256]",
        "empty": "[]",
        "not ids": '[1, "2"]',
        "too long": json.dumps([1] * 129),
    }
    cases = {
        "no checkpoint": ([str(tmp_path / "nope"), "--prompts", str(good)] + out, r"nope: not a checkpoint folder"),
        "not glm_moe_dsa": (
            [str(llama), "--prompts", str(good)] + out,
            r"llama/config.json: model_type 'llama', expected 'glm_moe_dsa'",
        ),
        "not converted": (
            [str(bf16), "--prompts", str(good)] + out,
            r"bf16/config.json: not a checkpoint the glm5_mxfp4 converter wrote",
        ),
        "missing shard": (
            [str(noshard), "--prompts", str(good)] + out,
            r"noshard/model-00002-of-00005.safetensors: named by model.safetensors.index.json, does not exist",
        ),
        "no prompt file": (
            [str(dst), "--prompts", str(tmp_path / "none.jsonl")] + out,
            r"none.jsonl: cannot read the prompt file: No such file or directory",
        ),
        "no sequences": (
            [str(dst), "--prompts", str(_jsonl(tmp_path / "blank.jsonl", []))] + out,
            r"blank.jsonl: no sequences",
        ),
        "groups": (
            [str(dst), "--prompts", str(good), "--groups", "3"] + out,
            r"8 experts do not split into 3 equal expert groups",
        ),
        "moe tp": (
            [str(dst), "--prompts", str(good), "--moe-tp", "3"] + out,
            r"GLM_MOE_TP=3 does not divide the 8 cards",
        ),
        "counts file": (
            [str(dst), "--counts", str(good)] + out,
            r"good.jsonl: format is None, expected 'glm5-moe-routing/1'",
        ),
    }
    messages = {
        "not json": "not a JSON line",
        "a dict": "a line is a list of token ids or a string, not dict",
        "out of range": r"token 256 is out of range 0..255",
        "empty": "an empty sequence",
        "not ids": r"item 1: '2' is not a token id",
        "too long": "129 tokens, above max_position_embeddings 128",
    }
    for name, line in lines.items():
        path = tmp_path / f"{name.replace(' ', '_')}.jsonl"
        path.write_text("[4, 5]\n" + line + "\n")
        cases[f"line: {name}"] = (
            [str(dst), "--prompts", str(path)] + out,
            re.escape(str(path)) + ":2: " + messages[name],
        )
    return cases


def test_bad_input_is_refused_naming_the_file_exit_2(tiny, tmp_path, capsys, clean_env):
    for name, (argv, pattern) in _bad(tiny, tmp_path).items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert re.search(pattern, err), (name, err)
        assert not (tmp_path / "o.json").exists(), name


def test_bad_counts_are_refused(tiny, tmp_path, capsys, clean_env):
    cfg = Checkpoint(tiny[1]).config
    good = {
        "format": "glm5-moe-routing/1",
        "n_routed_experts": 8,
        "top_k": 2,
        "layers": {"1": {"tokens": 2, "counts": [1, 1, 1, 1, 0, 0, 0, 0]}},
    }
    assert placement_fit.load_routing(_jsonl(tmp_path / "ok.json", [good]), cfg).counts == {1: [1, 1, 1, 1, 0, 0, 0, 0]}
    bad = {
        "dense layer": ({"0": good["layers"]["1"]}, r"layer 0: not a MoE layer of this model \(MoE layers: 1..3\)"),
        "short": ({"1": {"tokens": 2, "counts": [1, 1, 1, 1]}}, r"layer 1: counts must be 8 non-negative integers"),
        "sum": (
            {"1": {"tokens": 3, "counts": [1, 1, 1, 1, 0, 0, 0, 0]}},
            r"layer 1: the counts add up to 4, not tokens x top_k = 3 x 2",
        ),
    }
    for name, (layers, pattern) in bad.items():
        path = _jsonl(tmp_path / "bad.json", [{**good, "layers": layers}])
        with pytest.raises(FitError, match=pattern) as exc:
            placement_fit.load_routing(path, cfg)
        assert str(exc.value).startswith(f"{path}: "), name


def test_the_file_is_checked_before_it_is_written(tiny, tmp_path):
    """A body placement.py refuses is never written (an order that is not a permutation)."""
    cfg = Checkpoint(tiny[1]).config
    out = tmp_path / "p.json"
    body = {"format": placement.FORMAT, "n_routed_experts": 8, "layers": {"1": [0, 1, 2, 3, 4, 5, 6, 6]}}
    with pytest.raises(placement.PlacementError, match=r"p.json: layer 1: expert 6 appears twice \(slots 6 and 7\)"):
        placement_fit.write_placement(out, body, cfg)
    assert not out.exists() and list(tmp_path.iterdir()) == []
