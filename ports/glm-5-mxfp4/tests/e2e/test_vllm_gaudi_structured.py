"""Structured output under MTP: GLM-5.3 in MXFP4 served by vllm-gaudi's own HPUModelRunner on the
Habana emulation, on the v0.30.0 profile's development base (the tree, checkpoint and MTP set-up of
test_vllm_gaudi_emulation.py). Emulated results, not a card's.

Two kinds of request, greedy, stopping at EOS:
- a JSON schema (``StructuredOutputsParams(json=...)``, vLLM 0.27.0's field);
- ``tool_choice: "required"`` with two tools: the schema is made in the generate process by vLLM
  0.27.0's own ``vllm.tool_parsers.utils.get_json_schema_from_tools`` (what its OpenAI server's
  tool parser sets for such a request), and the reply parsed as that server parses a "required"
  reply (a JSON list of ``FunctionDefinition``). The OpenAI server itself serves such requests in
  test_vllm_gaudi_openai_server.py, launched as the serving page's recipe: its glm47 tool parser
  constrains "required" with the GLM-4.7 structural tag instead of this JSON list.

Each prompt runs alone. Batched, the replies under MTP parted from those without MTP in one run of
two (at a true/false choice of the first prompt), the MTP replies themselves differing between the
runs; the likely cause, not shown: vLLM compiles a grammar on a thread pool and schedules a request
once it is ready, so which requests share a step follows timing, and another batch shape rounds
bf16 differently at this tiny random model's near-ties.

The grammar backend is vLLM's choice ("auto": xgrammar 0.2.9 in .venv-cpu). Grammars need the
tokenizer's vocabulary, so the checkpoint here gets a byte-level tokenizer (``tokenizers``' BPE
with no merges) of the 252 non-whitespace byte symbols, token 0 being ``"``: the constant draft
(always token 0) is then a token the grammar often forces. vLLM's scheduler drops a draft the
grammar forbids, so the drafts verified are the ones it allows (all accepted in the run of
2026-12-04: 72 of 72; a rejected draft under a grammar is the port fix's test). The vocabulary has
no whitespace, so a random model cannot pad a JSON value with blanks forever.
"""

from __future__ import annotations

import json

import pytest

from packtests.mxfp4_runner import SCHEMA, TOOLS, byte_level, serve
from packtests.mxfp4_runner import STRUCTURED_PROMPTS as PROMPTS

jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

STRUCTURED = [
    {"json": SCHEMA, "max_tokens": 64, "alone": True},
    {"tools": TOOLS, "tool_choice": "required", "max_tokens": 160, "alone": True},
]


@pytest.fixture(scope="module")
def structured_ckpt(constant_draft, tmp_path_factory):
    """The constant-draft checkpoint with the byte-level tokenizer (``byte_level``)."""
    return byte_level(constant_draft, tmp_path_factory)


def _structured(tree, model, mtp: bool):
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    with pytest.MonkeyPatch.context() as mp:
        proc, result = serve(
            tree,
            model,
            mp,
            alone=False,
            engine_args=["skip_tokenizer_init=false", *([f"speculative_config={spec}"] if mtp else [])],
            # argparse keeps the last --prompts: these short prompts replace _serve's
            extra=["--prompts", json.dumps(PROMPTS), "--structured", json.dumps(STRUCTURED)],
        )
    assert result is not None, proc.stderr[-6000:]
    return result


@pytest.fixture(scope="module")
def with_mtp(tree, structured_ckpt):
    return _structured(tree, structured_ckpt, mtp=True)


@pytest.fixture(scope="module")
def without_mtp(tree, structured_ckpt):
    return _structured(tree, structured_ckpt, mtp=False)


def test_json_schema_under_mtp_validates_and_keeps_the_greedy_tokens(with_mtp, without_mtp):
    """Each reply ends at EOS, parses and validates against the schema; under MTP the tokens are
    those of the same runner without MTP, token for token; drafts were proposed and some accepted
    while the structured requests ran."""
    got, plain = with_mtp["structured"][0], without_mtp["structured"][0]
    assert got["schema"] == SCHEMA
    for reply in got["replies"] + plain["replies"]:
        assert reply["finish_reason"] == "stop", reply
        jsonschema.validate(json.loads(reply["text"]), SCHEMA)
    assert [r["token_ids"] for r in got["replies"]] == [r["token_ids"] for r in plain["replies"]]
    counts = with_mtp["structured_spec_decode"]
    assert counts.get("vllm:spec_decode_num_draft_tokens", 0) > 0, counts
    assert counts.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, counts
    assert "structured_spec_decode" not in without_mtp or not any(without_mtp["structured_spec_decode"].values())


def test_tool_choice_required_under_mtp_gives_calls_of_the_offered_tools(with_mtp, without_mtp):
    """The schema vLLM derives for tool_choice "required" (a non-empty array of {name, parameters});
    each reply ends at EOS and is a JSON list of calls as vLLM's parser reads it, each naming an
    offered tool with arguments that parse and validate against that tool's parameters; under MTP
    the tokens are those without MTP, token for token."""
    got, plain = with_mtp["structured"][1], without_mtp["structured"][1]
    assert got["schema"]["type"] == "array" and got["schema"]["minItems"] == 1, got["schema"]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for reply in got["replies"] + plain["replies"]:
        assert reply["finish_reason"] == "stop", reply
        jsonschema.validate(json.loads(reply["text"]), got["schema"])
        assert reply["tool_calls"], reply
        for call in reply["tool_calls"]:
            assert call["name"] in params, call
            jsonschema.validate(json.loads(call["arguments"]), params[call["name"]])
    assert [r["token_ids"] for r in got["replies"]] == [r["token_ids"] for r in plain["replies"]]
