"""A GLM-like tokenizer built offline, for fix tests that drive vLLM's GLM parsers and stop
conditions (glm47-streaming-text-markers, xgrammar-generation-eos-stop): a byte-level BPE
trained on a few lines, with GLM's special tokens (<|endoftext|>, <|user|>, ...) and its
added, non-special markup tokens (<think>, <tool_call>, ...), saved as a Hugging Face
tokenizer folder that vLLM's tokenizer loader reads.
"""

from __future__ import annotations

from pathlib import Path

GLM_SPECIAL = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
]
GLM_ADDED = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
]


def save_glm_like_tokenizer(dest: Path, corpus: list[str], vocab_size: int):
    """Train the BPE on ``corpus`` (each line five times), add GLM's tokens, save it to
    ``dest``; returns the PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[]
    )
    backend.train_from_iterator(corpus * 5, trainer)
    backend.add_special_tokens([AddedToken(t, special=True) for t in GLM_SPECIAL])
    backend.add_tokens([AddedToken(t, special=False) for t in GLM_ADDED])
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.save_pretrained(dest)
    return hf
