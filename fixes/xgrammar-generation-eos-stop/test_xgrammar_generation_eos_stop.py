"""With tool_choice "required" the request is constrained by an xgrammar JSON grammar.
Once the JSON value is complete, the grammar must let the model end its turn with any of
the generation config's EOS ids (GLM: <|endoftext|>, <|user|>, <|observation|>), which are
the ids vLLM stops the request on, not only the tokenizer's own EOS.

Everything is real and offline: a byte-level BPE tokenizer with GLM's special tokens,
loaded through vLLM's tokenizer loader; generation_config.json read by vLLM's
ModelConfig.try_get_generation_config; the tool_choice "required" schema built by the
glm47 tool parser's adjust_request; xgrammar on CPU through vLLM's XgrammarBackend."""

import json
import types

import pytest

from packtests.glm_tokenizer import save_glm_like_tokenizer

CALL = [{"name": "get_weather", "parameters": {"city": "Paris"}}]


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("glm_like")
    hf = save_glm_like_tokenizer(d, [json.dumps(CALL), "hello world"], vocab_size=400)
    vocab = hf.get_vocab()
    eos = [vocab["<|endoftext|>"], vocab["<|user|>"], vocab["<|observation|>"]]
    # As in GLM checkpoints: the generation config ends a turn on three ids.
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": eos[0]}))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
        "vocab_size": len(vocab) + 16, "eos_token_id": eos, "pad_token_id": eos[0],
    }))
    return d


@pytest.fixture()
def setup(tree, glm_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from vllm.config import ModelConfig, StructuredOutputsConfig
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    tokenizer = get_tokenizer(str(glm_dir))
    vocab = tokenizer.get_vocab()
    # A real ModelConfig, holding only what try_get_generation_config reads (building a
    # full one inspects the model architecture in a subprocess: a minute on this machine).
    model_config = object.__new__(ModelConfig)
    for key, value in dict(generation_config="auto", hf_config_path=None, model=str(glm_dir),
                           trust_remote_code=False, revision=None, config_format="auto",
                           hf_token=None).items():
        object.__setattr__(model_config, key, value)
    gen_eos = model_config.try_get_generation_config()["eos_token_id"]
    assert gen_eos == [vocab["<|endoftext|>"], vocab["<|user|>"], vocab["<|observation|>"]]
    assert tokenizer.eos_token_id == vocab["<|endoftext|>"]

    vllm_config = types.SimpleNamespace(
        model_config=model_config,
        structured_outputs_config=StructuredOutputsConfig(),
        speculative_config=None,
    )
    model_vocab_size = len(vocab) + 16  # a padded lm_head, as in real checkpoints
    backend = XgrammarBackend(vllm_config, tokenizer=tokenizer, vocab_size=model_vocab_size)
    return types.SimpleNamespace(backend=backend, tokenizer=tokenizer, vocab=vocab, gen_eos=gen_eos)


def required_tool_grammar(setup):
    """The grammar vLLM compiles for tool_choice "required" with --tool-call-parser glm47."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.glm47_moe_tool_parser import Glm47MoeModelToolParser
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    request = ChatCompletionRequest(
        model="glm",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[{"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]},
        }}],
        tool_choice="required",
    )
    request = Glm47MoeModelToolParser(setup.tokenizer).adjust_request(request)
    schema = request.structured_outputs.json
    assert schema is not None and schema["type"] == "array"
    return setup.backend.compile_grammar(StructuredOutputOptions.JSON, json.dumps(schema))


def allowed_ids(setup, grammar):
    bitmask = setup.backend.allocate_token_bitmask(1)
    grammar.fill_bitmask(bitmask, 0)
    row = bitmask[0].tolist()
    return {i for i in range(setup.backend.vocab_size) if (row[i // 32] >> (i % 32)) & 1}


def feed_complete_call(setup, grammar):
    ids = setup.tokenizer.encode(json.dumps(CALL), add_special_tokens=False)
    assert grammar.accept_tokens("req", ids), "the tool call JSON must be accepted"


def test_generation_config_eos_allowed_after_complete_json(setup):
    grammar = required_tool_grammar(setup)
    # Mid-value no EOS may end the turn (unchanged by the fix).
    assert not (allowed_ids(setup, grammar) & set(setup.gen_eos))

    feed_complete_call(setup, grammar)
    allowed = allowed_ids(setup, grammar)
    missing = [setup.tokenizer.convert_ids_to_tokens(i) for i in setup.gen_eos if i not in allowed]
    assert not missing, f"after a complete tool call the grammar forbids the end-of-turn tokens {missing}"
    # Besides the EOS ids only whitespace may follow the complete value: nothing else
    # was opened up.
    extra = allowed - set(setup.gen_eos)
    assert all(setup.tokenizer.decode([i]).strip() == "" for i in extra), extra


@pytest.mark.parametrize("end_token", ["<|user|>", "<|observation|>"])
def test_generation_config_eos_ends_the_grammar(setup, end_token):
    # The scheduler advances the grammar with the sampled stop token.
    grammar = required_tool_grammar(setup)
    feed_complete_call(setup, grammar)
    assert grammar.accept_tokens("req", [setup.vocab[end_token]]), (
        f"{end_token} is a stop id of the request but the grammar rejects it"
    )
    assert grammar.is_terminated()
