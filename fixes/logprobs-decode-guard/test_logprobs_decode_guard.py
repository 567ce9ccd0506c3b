"""One logprob id that the tokenizer cannot decode (outside the vocabulary, negative, too
large for the tokenizer's u32) must not raise in the API server's output path: the request
gets a placeholder text for that entry and the server keeps serving.

Real tokenizers built offline (tokenizers WordLevel models wrapped in transformers'
PreTrainedTokenizerFast: plain, SentencePiece-like Metaspace, and byte-level with
byte-fallback pieces), driven through vLLM's real OutputProcessor -> LogprobsProcessor."""

import numpy as np
import pytest
import torch

NORMAL = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "!": 5}
METASPACE = {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581hello": 3, "\u2581world": 4, "!": 5}
# Byte-level pieces: "Ã" + "©" are the two bytes of "é"; "Ã" alone decodes to U+FFFD.
BYTELEVEL = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "Ġworld": 4, "Ã": 5, "©": 6}

BAD_IDS = [len(NORMAL) + 10, 10**6, -1, 2**40]  # out of vocab, far out, negative, > u32


def make_tokenizer(kind):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"normal": NORMAL, "metaspace": METASPACE, "bytelevel": BYTELEVEL}[kind]
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    if kind == "metaspace":
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
        backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    elif kind == "bytelevel":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
    else:
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        backend.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def make_request(req_id, prompt_ids, *, logprobs=None, prompt_logprobs=None):
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    params = SamplingParams(
        max_tokens=8,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        output_kind=RequestOutputKind.DELTA,
    )
    return EngineCoreRequest(
        request_id=req_id,
        prompt_token_ids=prompt_ids,
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id=req_id,
    )


def sample_logprobs(rows):
    """rows: per generated position, [sampled id, top-1 id, top-2 id]."""
    from vllm.v1.outputs import LogprobsLists

    ids = np.array(rows, dtype=np.int64)
    lps = np.tile(np.array([-0.5, -1.5, -2.5], dtype=np.float32), (len(rows), 1))
    ranks = np.ones(len(rows), dtype=np.int64)
    return LogprobsLists(ids, lps, ranks)


def step(processor, req_id, token_id, logprob_rows=None, prompt_tensors=None):
    from vllm.v1.engine import EngineCoreOutput

    out = EngineCoreOutput(
        request_id=req_id,
        new_token_ids=[token_id],
        new_logprobs=None if logprob_rows is None else sample_logprobs(logprob_rows),
        new_prompt_logprobs_tensors=prompt_tensors,
    )
    result = processor.process_outputs([out])
    (request_output,) = result.request_outputs
    return request_output


# A plain tokenizer already decodes an id outside its vocabulary to "" (the backend
# skips it); a Metaspace one fails on it in the leading-space repair. Negative and huge
# ids fail in the backend for both.
CASES = pytest.mark.parametrize(
    "kind,bad",
    [("normal", -1), ("normal", 2**40)] + [("metaspace", bad) for bad in BAD_IDS],
    ids=["plain-negative", "plain-huge", "metaspace-oov", "metaspace-far-oov",
         "metaspace-negative", "metaspace-huge"],
)


@CASES
@pytest.mark.red_raises("OverflowError", "TypeError")
def test_sample_logprob_with_undecodable_id_gets_placeholder(tree, kind, bad):
    from vllm.v1.engine.output_processor import OutputProcessor

    tokenizer = make_tokenizer(kind)
    processor = OutputProcessor(tokenizer, log_stats=False)
    processor.add_request(make_request("r0", [1, 3], logprobs=2), prompt=None)

    out = step(processor, "r0", 4, logprob_rows=[[4, bad, 3]])
    (completion,) = out.outputs
    (position,) = completion.logprobs
    assert list(position) == [4, bad, 3]
    assert position[bad].decoded_token == ""  # the placeholder
    assert position[4].decoded_token.strip() == "world"
    assert position[3].decoded_token.strip() == "hello"

    # The same request and a new one keep being served.
    out = step(processor, "r0", 5, logprob_rows=[[5, 3, bad]])
    assert out.outputs[0].logprobs[0][5].decoded_token == "!"
    processor.add_request(make_request("r1", [1, 4], logprobs=2), prompt=None)
    out = step(processor, "r1", 3, logprob_rows=[[3, 4, 5]])
    assert out.outputs[0].logprobs[0][3].decoded_token.strip() == "hello"


@CASES
@pytest.mark.red_raises("OverflowError", "TypeError")
def test_prompt_logprob_with_undecodable_id_gets_placeholder(tree, kind, bad):
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.outputs import LogprobsTensors

    tokenizer = make_tokenizer(kind)
    processor = OutputProcessor(tokenizer, log_stats=False)
    processor.add_request(make_request("r0", [1, 3, 4], prompt_logprobs=1), prompt=None)

    # Positions 1 and 2 of the prompt: [prompt token, top-1].
    tensors = LogprobsTensors(
        torch.tensor([[3, bad], [4, 3]]),
        torch.tensor([[-0.5, -1.0], [-0.2, -3.0]]),
        torch.tensor([1, 1]),
    )
    out = step(processor, "r0", 5, prompt_tensors=tensors)
    prompt_logprobs = out.prompt_logprobs
    assert prompt_logprobs[1][bad].decoded_token == ""
    assert prompt_logprobs[1][3].decoded_token.strip() == "hello"
    assert prompt_logprobs[2][4].decoded_token.strip() == "world"


@pytest.mark.parametrize("bad", [-7, 2**40], ids=["negative", "huge"])
@pytest.mark.red_raises("OverflowError")
def test_undecodable_sampled_id_in_utf8_repair_context(tree, bad):
    """A sampled id that cannot be decoded, followed by a byte-fallback piece: the UTF-8
    repair decodes the previous sampled ids together with the new one."""
    from vllm.v1.engine.output_processor import OutputProcessor

    tokenizer = make_tokenizer("bytelevel")
    assert tokenizer.decode([5]).endswith("\ufffd")  # a half of "é"
    processor = OutputProcessor(tokenizer, log_stats=False)
    processor.add_request(make_request("r0", [1, 3], logprobs=2), prompt=None)

    # The detokenizer of the sampled text guards its own bad ids; the logprobs must too.
    step(processor, "r0", 4, logprob_rows=[[bad, 4, 3]])
    out = step(processor, "r0", 5, logprob_rows=[[5, 6, 3]])
    position = out.outputs[0].logprobs[0]
    assert list(position) == [5, 6, 3]
    assert position[3].decoded_token == "hello"
    out = step(processor, "r0", 6, logprob_rows=[[6, 5, 3]])
    assert list(out.outputs[0].logprobs[0]) == [6, 5, 3]
