"""vLLM 0.27.0's real OpenAI API server (``python -m vllm.entrypoints.openai.api_server``, as a user
launches it) serving GLM-5.3 in MXFP4 on vllm-gaudi's own HPUModelRunner, on the Habana emulation,
on the v0.30.0 profile's development base. Emulated results, not a card's.

The tree, the checkpoint and the reference are the runner e2e tests' (packtests/mxfp4_runner.py,
the fixtures in conftest.py): vllm-gaudi main 091bbad with the port's patches and the profile's
defaults, vLLM 0.27.0's Python beside it; the tiny glm_moe_dsa written by transformers 5.23.0 and converted by the port's
converter; transformers 5.23.0 in bf16 with the converter's dequantized experts as the reference
(tokens may part from it only where its top two logits are within TIE). The served copy differs
from that checkpoint in two ways, neither touching the target model:

- its MTP layer repeats the token just generated (``repeating_draft``), so drafts are both
  accepted and rejected;
- it has test_vllm_gaudi_structured.py's byte-level tokenizer (``byte_level``: EOS 252, no
  whitespace), whose vocabulary the grammars of structured output and tool calls need. The
  converter copied the tiny checkpoint's chat template (the messages' contents one after the
  other), so no ``--chat-template`` is given, and a message holding the text of the structured
  test's prompt renders to exactly that prompt's token ids (asserted).

The launch is the serving page's recipe (recipes/zai-org/GLM-5.3-BF16/recipe.yaml, read with
fixpack's own loader): its environment, the port's switches and every ``vllm serve`` flag, except
what one emulated rank and this tiny model cannot take, each listed below (``SCALED``, ``DROPPED``,
``ADDED``) with the reason. So GLM_DSA_SPARSE, GLM_MXK, GLM_MXK_PREFILL (the kernels' emulation),
GLM_ROUTER_FAST, GLM_EARLY_DRAFT and GLM_SPEC_DEVICE_REJECT are at the launch's values; GLM_MOE_TP
is not set: expert groups of 2 cards need at least 2 ranks with expert parallelism (at TP 1
GLM_MOE_TP=2 stops the engine at start-up naming it, test_vllm_gaudi_emulation.py), and the
page's EP 4 x TP 2 layout runs through ``LLM.generate`` at TP 4 and TP 8 in
test_vllm_gaudi_moe_tp.py. The recipe's other exports go in as written: the page's bucket file
(vllm-gaudi leaves out its buckets above this window), the MoE chunk sizes, the timeouts; two act
on nothing in this tree: VLLM_LONG_PREFILL_* (read only by the profile's opt-in fix
vllm-long-prefill-share, a fix of vLLM 0.30.0's files, while this tree's vLLM is 0.27.0's) and
VLLM_HPU_FSDPA_SOFTMAX_MODE (read by neither tree); vLLM logs both as unknown variables.

Tool calls: the recipe's ``--tool-call-parser glm47`` does not take "required" as a JSON list of
calls (vLLM 0.27.0's glm47 parser sets ``supports_required_and_named = False``); vLLM constrains
the reply with xgrammar's GLM-4.7 structural tag instead (vllm/parser/abstract_parser.py,
``_apply_structural_tag``) and parses it with the glm47 parser, so this is a different grammar from
the structured test's, the one a user of the page gets.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixpack.pack.recipe import COOKBOOK, load_recipe
from glm5_hpu.switches import read_switches
from hpu_harness import serve
from packtests.mxfp4_runner import (
    EOS,
    MAX_LEN,
    NEW_TOKENS,
    PLUGIN,
    PORT,
    PROMPTS,
    REPO,
    SCHEMA,
    STRUCTURED_PROMPTS,
    SWITCHES,
    TIE,
    TOOLS,
    byte_level,
    repeating_draft,
)

jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow
RECIPE = REPO / "recipes" / "zai-org" / "GLM-5.3-BF16" / "recipe.yaml"
# The recipe's flags whose value one emulated rank and the tiny model need otherwise.
SCALED = {
    "--tensor-parallel-size": 1,  # one rank; TP 4 and 8 run in test_vllm_gaudi_moe_tp.py
    "--max-model-len": MAX_LEN,  # the tiny checkpoint's window
    # Scaled with the window, so that the 300-token prompt is prefilled in chunks beside the others,
    # as the page's long prompts are.
    "--max-num-batched-tokens": 256,
    "--long-prefill-token-threshold": 128,
}
# What is left out of the recipe, and why.
DROPPED = {
    # With a reasoning parser vLLM applies a request's grammar only once the reasoning has ended
    # (vllm/v1/structured_output/__init__.py, `reasoning_ended`): at a </think> this vocabulary does
    # not hold and a random model would not write, so no structured request would be constrained.
    "--reasoning-parser": "no </think> to end the reasoning",
    # Expert groups of 2 ranks: not at TP 1 (see the module's docstring).
    "GLM_MOE_TP": "needs more than one rank",
    # The page's placement file is fitted to GLM-5.3's routing statistics and is not built; the
    # placement itself runs in test_vllm_gaudi_moe_tp.py.
    "GLM_MOE_PLACEMENT": "the page's file is not built",
}
# Added for the emulation: the emulated card's memory is host memory, so the KV cache is sized
# for --max-num-seqs sequences of the window (16 blocks of 128), not for 86% of a card.
ADDED = {"--num-gpu-blocks-override": 16}
LAUNCH = dict(load_recipe(RECIPE).args())  # flag -> value (None for a bare flag)
SERVED_NAME = LAUNCH["--served-model-name"]
STRUCTURED_TOKENS = 64  # as the structured test's JSON replies
TOOL_TOKENS = 160  # as its tool replies; a get_weather call in the GLM-4.7 format takes 132


def _launch(model: Path) -> tuple[list[str], dict[str, str]]:
    """The recipe's ``vllm serve`` flags and exports for ``model``, with SCALED, DROPPED and ADDED."""
    recipe = load_recipe(RECIPE)
    args = recipe.args()
    exports = {name: value for _, name, value in recipe.exports()}
    named = {flag for flag, _ in args} | set(exports)
    assert set(SCALED) | set(DROPPED) <= named, "the recipe changed: revisit SCALED and DROPPED"
    assert not set(ADDED) & named
    argv = ["--model", str(model)]
    for flag, value in [*args, *ADDED.items()]:
        if flag in DROPPED:
            continue
        value = SCALED.get(flag, value)
        if value is None:
            argv.append(flag)
        else:
            argv += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    env = {
        name: value.replace(COOKBOOK, f"{REPO}/", 1) if value.startswith(COOKBOOK) else value
        for name, value in exports.items()
        if name not in DROPPED
    }
    return argv, env


@pytest.fixture(scope="module")
def server(tree, ckpt, tmp_path_factory):  # noqa: F811
    """vLLM's OpenAI server on loopback (``hpu_harness.serve``: its own session, stopped with the
    module) on the emulation, lazy mode with HPU graphs, the port's plugin registered from the port
    folder, serving the repeating-draft checkpoint with the byte-level tokenizer."""
    model = byte_level(repeating_draft(ckpt[1], tmp_path_factory), tmp_path_factory)
    folder = tmp_path_factory.mktemp("openai_server")
    env = serve.environment(
        str(tree), lazy=True, plugins=[tuple(PLUGIN.split("=", 1))], paths=[str(PORT)], folder=str(folder / "runtime")
    )
    for name in SWITCHES:
        env.pop(name, None)  # only the recipe's switches
    argv, exports = _launch(model)
    env.update(exports)
    log = folder / "server.log"
    t0 = time.monotonic()
    with serve.running(argv, env, log) as base:
        yield SimpleNamespace(base=base, model=model, log=log, env=env, start_s=time.monotonic() - t0)


def _completions(server, prompts, **kw) -> list[dict]:
    body = dict(model=SERVED_NAME, prompt=prompts, max_tokens=NEW_TOKENS, ignore_eos=True, return_token_ids=True, **kw)
    status, reply = serve.post(server.base + "/v1/completions", body)
    assert status == 200, reply
    choices = sorted(reply["choices"], key=lambda c: c["index"])
    assert [c["prompt_token_ids"] for c in choices] == prompts
    return choices


def _chats(server, bodies: list[dict]) -> list[dict]:
    """The chat requests sent together (the server batches them); each one's prompt checked to be
    the structured test's prompt of its place, token for token."""

    def one(body):
        return serve.post(
            server.base + "/v1/chat/completions", {"model": SERVED_NAME, "return_token_ids": True, **body}
        )

    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(one, bodies))
    for (status, reply), prompt in zip(replies, STRUCTURED_PROMPTS[: len(replies)], strict=True):
        assert status == 200, reply
        assert reply["prompt_token_ids"] == prompt, "the chat template rendered another prompt"
    return [reply for _, reply in replies]


def _messages(server) -> list[list[dict]]:
    """One user message per structured prompt: its text in the byte-level vocabulary."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(server.model / "tokenizer.json"))
    return [[{"role": "user", "content": tok.decode(p)}] for p in STRUCTURED_PROMPTS]


@pytest.fixture(scope="module")
def greedy(server):
    """PROMPTS in one completions request, greedy, NEW_TOKENS each, with the top-5 logprobs (token
    ids as the keys: the byte-level vocabulary decodes many ids to the same text)."""
    return _completions(server, PROMPTS, temperature=0, logprobs=5, return_tokens_as_token_ids=True)


def test_greedy_completions_match_transformers(greedy, reference):  # noqa: F811
    """The server's greedy tokens for PROMPTS (sent as token ids, batched by the server, the
    300-token prompt prefilled in chunks) equal the reference's, parting only at a near-tie."""
    assert all(c["finish_reason"] == "length" for c in greedy)
    reference.check_divergence([c["token_ids"] for c in greedy], TIE)


def test_logprobs_complete_finite_and_the_greedy_token_most_likely(greedy):
    """Top-5 logprobs under MTP: for every generated token five or more alternatives, all finite
    and at most 0, the greedy token's the largest and equal to its own logprob."""
    for choice in greedy:
        lp = choice["logprobs"]
        assert len(lp["top_logprobs"]) == len(choice["token_ids"]) == NEW_TOKENS
        for token, own, top in zip(choice["token_ids"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
            values = list(top.values())
            assert len(top) >= 5 and all(math.isfinite(v) and v <= 0 for v in values), top
            assert top[f"token_id:{token}"] == max(values) == own, (token, own, top)


def test_seeded_sampling_completes_and_repeats(server, greedy):
    """Temperature 1 with a seed (top_p from the recipe's --override-generation-config), the
    shortest prompts, as many as one batch holds (--max-num-seqs; a shorter test than all of
    them): every prompt gets NEW_TOKENS tokens of the model's vocabulary, not the greedy ones, and
    the same request again gets the same tokens."""
    prompts = sorted(PROMPTS, key=len)[: LAUNCH["--max-num-seqs"]]
    vocab = json.loads((server.model / "config.json").read_text())["vocab_size"]
    runs = [_completions(server, prompts, temperature=1.0, seed=1234) for _ in range(2)]
    tokens = [[c["token_ids"] for c in run] for run in runs]
    assert all(len(t) == NEW_TOKENS and all(0 <= i < vocab for i in t) for t in tokens[0]), tokens[0]
    greedy_of = {tuple(c["prompt_token_ids"]): c["token_ids"] for c in greedy}
    assert tokens[0] != [greedy_of[tuple(p)] for p in prompts]
    assert tokens[1] == tokens[0]


def test_json_schema_replies_validate(server):
    """``response_format`` json_schema with the structured test's SCHEMA and prompts, greedy to EOS:
    every reply ends at EOS and its text parses and validates against the schema."""
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
    bodies = [
        dict(messages=m, temperature=0, max_tokens=STRUCTURED_TOKENS, response_format=fmt) for m in _messages(server)
    ]
    for reply in _chats(server, bodies):
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == EOS, choice
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_tool_choice_required_gives_calls_of_the_offered_tools(server):
    """``tool_choice: "required"`` with the structured test's TOOLS and its first prompt (the JSON
    test above batches three grammar requests; one here keeps the file short): the reply holds tool
    calls (parsed by the glm47 parser from the GLM-4.7 format the structural tag enforces), each
    naming an offered tool with arguments that are JSON valid for that tool's parameters.

    GLM-5.3 ends its turn after a call with one of its EOS ids; the tiny random model writes on
    after it (free text is allowed past a call: vLLM asks for at least one), so the request stops
    at the call's end tag, kept in the reply for the parser (about half the time of running on to
    max_tokens here)."""
    stop = dict(stop=["</tool_call>"], include_stop_str_in_output=True)
    bodies = [
        dict(messages=m, temperature=0, max_tokens=TOOL_TOKENS, tools=TOOLS, tool_choice="required", **stop)
        for m in _messages(server)[:1]
    ]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for reply in _chats(server, bodies):
        choice = reply["choices"][0]
        # vLLM's reason for a "required" reply that stopped (at the end tag, not at max_tokens)
        assert choice["finish_reason"] == "tool_calls" and choice["stop_reason"] == "</tool_call>", choice
        calls = choice["message"]["tool_calls"]
        assert calls, reply
        for call in calls:
            assert call["type"] == "function" and call["function"]["name"] in params, call
            jsonschema.validate(json.loads(call["function"]["arguments"]), params[call["function"]["name"]])


def test_the_log_shows_vllm_gaudis_runner_and_the_ports_hpu_model(server):
    """The server's log: vllm-gaudi's HPUModelRunner loaded the model (its own log line, from
    vllm_gaudi/v1/worker/hpu_model_runner.py; vLLM's GPU runner logs the same words from
    gpu_model_runner.py), vllm-gaudi's MLA backend was chosen, the port's HPU model and MTP draft
    classes were built with the switches the server's environment sets, and the MoE runs on the
    GLM kernels (here their emulation)."""
    log = server.log.read_text()
    assert "[hpu_model_runner.py:" in log and "] Starting to load model " in log, log[-4000:]
    assert "Using HPUAttentionMLA backend" in log
    switches = read_switches(server.env)
    assert switches.moe_tp == 1 and switches.mxk and switches.early_draft and switches.spec_device_reject
    assert f"glm5_hpu: building glm5_hpu.vllm_hpu:GlmMoeDsaHpuForCausalLM, {switches}" in log
    assert "glm5_hpu: building glm5_hpu.vllm_hpu:GlmMoeDsaHpuMTP" in log
    assert "glm5_hpu: MXFP4 MoE with the GLM kernels (" in log


def _metric(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples (one per engine)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert values, f"{name} not in /metrics"
    return sum(values)


def test_metrics_show_drafts_accepted_and_rejected(server, greedy):
    """vLLM 0.27.0's speculative counters on /metrics (vllm/v1/spec_decode/metrics.py; Prometheus
    adds _total): drafts proposed, some accepted and some rejected. Last in the module, so the
    counts cover every request above."""
    status, text = serve.post(server.base + "/metrics")
    assert status == 200
    drafts = _metric(text, "vllm:spec_decode_num_drafts_total")
    proposed = _metric(text, "vllm:spec_decode_num_draft_tokens_total")
    accepted = _metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and proposed == drafts * LAUNCH["--speculative-config"]["num_speculative_tokens"]
    assert 0 < accepted < proposed, (accepted, proposed)
    print(
        f"OpenAI server on vllm-gaudi's runner (emulation): {int(accepted)} of {int(proposed)} draft tokens "
        f"accepted, {int(proposed - accepted)} rejected; server up in {server.start_s:.0f} s"
    )
