"""A tiny random GLM-5.3-Flash checkpoint on disk: real key names (save_pretrained), both layer
kinds, MoE, mHC, the vision tower; and an offline WordLevel tokenizer saved alongside."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import reference_harness as rh

# Head size of the NoPE MLA heads: vLLM's CPU attention accepts 32 (not the harness's 16).
HEAD = 32


def e2e_config():
    cfg = rh.tiny_config(index_topk=128)
    t = cfg.text_config
    t.qk_nope_head_dim = HEAD
    t.v_head_dim = HEAD
    if hasattr(t, "qk_head_dim"):
        t.qk_head_dim = HEAD
    t.eos_token_id = None
    cfg.architectures = ["Glm5NextForConditionalGeneration"]
    return cfg


def build(path: Path, seed: int = 0):
    """Save reference weights + config + tokenizer + image processor to ``path``; return the
    reference model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.glm5_next import Glm5NextImageProcessor, Glm5NextProcessor, Glm5NextVideoProcessor
    from transformers.models.glm5_next import modeling_glm5_next as ref

    torch.manual_seed(seed)
    cfg = e2e_config()
    model = ref.Glm5NextForConditionalGeneration(cfg).eval()
    rh.unhide(model, seed + 1)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    vocab = {f"w{i}": i for i in range(cfg.text_config.vocab_size)}
    # id 1 is [UNK] (no test prompt uses it): a rendered chat prompt has words outside the vocabulary
    # ("Reasoning effort: max"), and a WordLevel vocabulary keeps one word per id when saved.
    del vocab["w1"]
    vocab["[UNK]"] = 1
    specials = special_tokens(cfg)
    for name, i in specials.items():
        del vocab[f"w{i}"]
        vocab[name] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="w0")
    # The processor class wants its video processor too; the port serves no video (vLLM refuses it).
    processor = Glm5NextProcessor(image_processor=Glm5NextImageProcessor(), tokenizer=fast,
                                  video_processor=Glm5NextVideoProcessor())
    processor.save_pretrained(path)  # the tokenizer files and processor_config.json
    return model, cfg


# Chat markers of the port's serving template (serving/chat_template.jinja) and of vLLM's glm47
# tool / glm45 reasoning parsers, on ids no test prompt uses.
CHAT_TOKENS = {"[gMASK]": 240, "<sop>": 241, "<|system|>": 242, "<|user|>": 243, "<|assistant|>": 244,
               "<think>": 251, "</think>": 252, "<|observation|>": 253, "<tool_call>": 254, "</tool_call>": 255}


def special_tokens(cfg) -> dict[str, int]:
    return {
        "<|image|>": cfg.image_token_id, "<|begin_of_image|>": cfg.image_start_token_id,
        "<|end_of_image|>": cfg.image_end_token_id, "<|video|>": cfg.video_token_id,
        "<|begin_of_video|>": cfg.video_start_token_id, "<|end_of_video|>": cfg.video_end_token_id,
        **CHAT_TOKENS,
    }


def prompt_ids(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [7, 23, 64, 90, 3, 41][:n]
    return [torch.randint(2, 240, (L,), generator=g).tolist() for L in lengths]


# ----------------------------------------------------------------------------- image prompts
# Sizes (height, width) of the test images: with the processor's defaults (min 16 tokens per
# image) they give 20, 24, 16 and 24 image tokens; two are scaled up, three are padded.
IMAGE_SIZES = [(56, 84), (100, 60), (28, 28), (84, 56)]
BIG_IMAGE = (336, 336)  # 144 tokens at the checkpoint's own cap (8000); resized by a lower one


def noise_image(height: int, width: int, seed: int):
    """A PIL RGB image of seeded uniform noise: every pixel reaches the tower."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def images_for(n: int, seed: int = 0) -> list:
    return [noise_image(*IMAGE_SIZES[i % len(IMAGE_SIZES)], seed=seed + i) for i in range(n)]


def image_prompt_ids(cfg, n_images: int, seed: int = 0) -> list[int]:
    """Text, then each image as the chat template writes it (<|begin_of_image|><|image|>
    <|end_of_image|>) followed by more text: text before, between and after the images."""
    g = torch.Generator().manual_seed(1000 + seed)
    words = lambda k: torch.randint(2, 240, (k,), generator=g).tolist()  # noqa: E731
    ids = words(5)
    for _ in range(n_images):
        ids += [cfg.image_start_token_id, cfg.image_token_id, cfg.image_end_token_id] + words(3)
    return ids + words(4)


def expand_image_tokens(ids: list[int], grids, image_token_id: int, merge: int = 2) -> list[int]:
    """Each image token -> t*h*w/merge**2 copies, image by image (what the processor does)."""
    out, k = [], 0
    for i in ids:
        if i == image_token_id:
            out += [i] * (int(torch.as_tensor(grids[k]).prod()) // (merge * merge))
            k += 1
        else:
            out.append(i)
    assert k == len(grids), (k, len(grids))
    return out


def reference_greedy(ref, path, ids: list[int], images: list, new_tokens: int, max_image_tokens: int | None = None):
    """The transformers reference's greedy tokens for ``ids`` (one image token per image) with
    ``images`` run through the checkpoint's own image processor: (expanded prompt ids, tokens)."""
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(str(path)).image_processor
    kw = {} if max_image_tokens is None else {"max_image_tokens": max_image_tokens}
    px = proc(images, return_tensors="pt", **kw)
    full = expand_image_tokens(ids, px["image_grid_thw"], ref.config.image_token_id)
    with torch.no_grad():
        out = ref.generate(torch.tensor([full]), pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"],
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return full, out[0, len(full):].tolist()
