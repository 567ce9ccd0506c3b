"""GLM models sometimes write <tool_call> / </tool_call> / <think> / </think> as plain text
(ordinary byte pieces) instead of their special tokens. The non-streaming parse (the
serving layer's parser.parse) recognises the text; the streaming parse (parser.parse_delta
with token ids, as chat streaming calls it) must too, so both return the same reasoning,
content and tool calls.

Driven through the parser the OpenAI server builds for --tool-call-parser glm47
--reasoning-parser glm47 --enable-auto-tool-choice (ParserManager.get_parser), with a real
GLM-like byte-level BPE tokenizer built offline (GLM's special and added tokens)."""

import json

import pytest

from packtests.glm_tokenizer import save_glm_like_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}}]


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("glm_like")
    corpus = ["Let me check the weather. get_weather city Paris tool call think arg key value"]
    save_glm_like_tokenizer(d, corpus, vocab_size=500)
    return d


def parser_for(glm_dir, name):
    from vllm.parser.parser_manager import ParserManager
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(glm_dir))
    parser_cls = ParserManager.get_parser(
        tool_parser_name=name, reasoning_parser_name=name, enable_auto_tools=True
    )
    return tokenizer, parser_cls


@pytest.fixture()
def glm(tree, glm_dir):
    return parser_for(glm_dir, "glm47")


@pytest.fixture()
def ling3(tree, glm_dir):
    # Ling3 reuses glm47_moe_config: the opt-in must not change it.
    return parser_for(glm_dir, "ling3")


def as_special(tokenizer, marker):
    (tid,) = tokenizer.encode(marker, add_special_tokens=False)
    return [tid]


def as_text(tokenizer, marker):
    """The marker spelled with ordinary pieces, as a model may write it."""
    inner = marker.strip("<>/")
    pieces = ["</" if marker.startswith("</") else "<", inner, ">"]
    ids = [i for p in pieces for i in tokenizer.encode(p, add_special_tokens=False)]
    assert as_special(tokenizer, marker)[0] not in ids
    assert tokenizer.decode(ids) == marker
    return ids


def output_ids(tokenizer, text_markers):
    """<think>Let me check.</think><tool_call>get_weather<arg_key>city</arg_key>
    <arg_value>Paris</arg_value></tool_call>, each marker in `text_markers` spelled in
    ordinary pieces, the others as their token."""
    def marker(m):
        return as_text(tokenizer, m) if m in text_markers else as_special(tokenizer, m)

    def text(t):
        return tokenizer.encode(t, add_special_tokens=False)

    return (marker("<think>") + text("Let me check the weather.") + marker("</think>")
            + marker("<tool_call>") + text("get_weather") + marker("<arg_key>") + text("city")
            + marker("</arg_key>") + marker("<arg_value>") + text("Paris")
            + marker("</arg_value>") + marker("</tool_call>"))


def new_request(parser):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(
        model="glm", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS, tool_choice="auto",
    )
    return parser.adjust_request(request)


def parse_complete(glm, ids):
    tokenizer, parser_cls = glm
    parser = parser_cls(tokenizer, TOOLS, chat_template_kwargs={})
    request = new_request(parser)
    reasoning, content, calls = parser.parse(
        tokenizer.decode(ids), request, enable_auto_tools=True, model_output_token_ids=ids
    )
    calls = [(c.name, json.loads(c.arguments)) for c in calls or []]
    return (reasoning or "").strip(), (content or "").strip(), calls


def parse_streamed(glm, ids, prompt_ids, chunk=1):
    """`chunk` tokens per delta, as chat streaming feeds parse_delta (1, or more with a
    stream interval)."""
    tokenizer, parser_cls = glm
    parser = parser_cls(tokenizer, TOOLS, chat_template_kwargs={})
    request = new_request(parser)
    reasoning, content, names, args = [], [], {}, {}
    for start in range(0, len(ids), chunk):
        delta_ids = ids[start:start + chunk]
        delta = parser.parse_delta(
            delta_text=tokenizer.decode(delta_ids), delta_token_ids=delta_ids, request=request,
            prompt_token_ids=prompt_ids, finished=start + chunk >= len(ids),
        )
        if delta is None:
            continue
        reasoning.append(delta.reasoning or "")
        content.append(delta.content or "")
        for tc in delta.tool_calls or []:
            if tc.function and tc.function.name:
                names[tc.index] = tc.function.name
            if tc.function and tc.function.arguments:
                args[tc.index] = args.get(tc.index, "") + tc.function.arguments
    calls = [(names[i], json.loads(args.get(i) or "{}")) for i in sorted(names)]
    return "".join(reasoning).strip(), "".join(content).strip(), calls


EXPECTED = ("Let me check the weather.", "", [("get_weather", {"city": "Paris"})])


@pytest.mark.parametrize(
    "text_markers",
    [("<tool_call>", "</tool_call>"), ("<think>", "</think>", "<tool_call>", "</tool_call>")],
    ids=["tool-markers-as-text", "all-markers-as-text"],
)
def test_streaming_agrees_with_complete_parse_for_text_markers(glm, text_markers):
    tokenizer, _ = glm
    prompt_ids = tokenizer.encode("<|user|>Weather in Paris?<|assistant|>", add_special_tokens=False)

    # The same output with every marker as its token: both paths already agree.
    ids = output_ids(tokenizer, text_markers=())
    assert parse_complete(glm, ids) == EXPECTED
    for chunk in (1, 3):
        assert parse_streamed(glm, ids, prompt_ids, chunk) == EXPECTED

    ids = output_ids(tokenizer, text_markers)
    assert parse_complete(glm, ids) == EXPECTED
    for chunk in (1, 3):
        streamed = parse_streamed(glm, ids, prompt_ids, chunk)
        assert streamed == EXPECTED, (
            f"streaming ({chunk} token(s) per delta) disagrees with the complete parse "
            f"for markers written as text: {streamed}"
        )


@pytest.mark.releases("v0.30.0")  # Ling3Parser is new in vLLM 0.30.0
def test_ling3_which_reuses_the_glm_config_is_unchanged(ling3):
    """Scope guard (passes before and after): ling3 builds its parser from the same config
    function; the opt-in is named for glm47 and leaves ling3's streaming as it was."""
    tokenizer, _ = ling3
    prompt_ids = tokenizer.encode("<|user|>Weather in Paris?<|assistant|>", add_special_tokens=False)
    ids = output_ids(tokenizer, text_markers=())
    assert parse_streamed(ling3, ids, prompt_ids) == EXPECTED
    # Markers as text after token ids are still content for ling3, as in the release.
    ids = output_ids(tokenizer, ("<tool_call>", "</tool_call>"))
    reasoning, content, calls = parse_streamed(ling3, ids, prompt_ids)
    assert (reasoning, calls) == ("Let me check the weather.", [])
    assert content.startswith("<tool_call>get_weather")
