"""A tiny random GLM-5.3-Flash checkpoint on disk: real key names (save_pretrained), both layer
kinds, MoE, mHC, the vision tower; and an offline WordLevel tokenizer saved alongside."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import torch

from packtests import flash_reference as rh

# the port's chat template (its serving folder), as the recipe's server is given it
CHAT_TEMPLATE = Path(__file__).resolve().parents[1] / "ports" / "glm-5-3-flash" / "serving" / "chat_template.jinja"
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
    processor = Glm5NextProcessor(
        image_processor=Glm5NextImageProcessor(), tokenizer=fast, video_processor=Glm5NextVideoProcessor()
    )
    processor.save_pretrained(path)  # the tokenizer files and processor_config.json
    return model, cfg


# Chat markers of the port's serving template (serving/chat_template.jinja) and of vLLM's glm47
# tool / glm45 reasoning parsers, on ids no test prompt uses.
CHAT_TOKENS = {
    "[gMASK]": 240,
    "<sop>": 241,
    "<|system|>": 242,
    "<|user|>": 243,
    "<|assistant|>": 244,
    "<think>": 251,
    "</think>": 252,
    "<|observation|>": 253,
    "<tool_call>": 254,
    "</tool_call>": 255,
}


def special_tokens(cfg) -> dict[str, int]:
    return {
        "<|image|>": cfg.image_token_id,
        "<|begin_of_image|>": cfg.image_start_token_id,
        "<|end_of_image|>": cfg.image_end_token_id,
        "<|video|>": cfg.video_token_id,
        "<|begin_of_video|>": cfg.video_start_token_id,
        "<|end_of_video|>": cfg.video_end_token_id,
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
        out = ref.generate(
            torch.tensor([full]),
            pixel_values=px["pixel_values"],
            image_grid_thw=px["image_grid_thw"],
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
    return full, out[0, len(full) :].tolist()


# ----------------------------------------------------------------------------- block-FP8 variant
# Which projections the published block-FP8 release stores in FP8 (the rest BF16): the MLA
# projections q_a / kv_a_proj_with_mqa / q_b / o_proj and the indexer's wk / wq_b, the dense MLP,
# the shared and the routed experts. KDA projections, kv_b_proj, the indexer's weights_proj, the
# router, the vision tower, embeddings and lm_head stay BF16 and are listed in
# modules_to_not_convert (norms, mHC, A_log, conv and biases are not projection weights). Read from
# the release's handling in vLLM's own GLM-5.3-Flash loader, not from the release's config.json.
FP8_BLOCK = (16, 16)  # 128 x 128 in the release; scaled down so the tiny shapes (16..256) divide
_FP8_MLA = re.compile(r"\.self_attn\.(q_a_proj|kv_a_proj_with_mqa|q_b_proj|o_proj|indexer\.wk|indexer\.wq_b)\.weight$")
_FP8_MLP = re.compile(r"\.mlp\.(gate_proj|up_proj|down_proj|shared_experts\.\w+|experts\.\d+\.\w+)\.weight$")


def _mla_layers(cfg) -> set[int]:
    return {i for i, t in enumerate(cfg.text_config.layer_types) if t != "linear_attention"}


def fp8_stored(key: str, cfg) -> bool:
    """Whether the release stores ``key`` in block FP8."""
    if not key.startswith("model.language_model.layers."):
        return False
    layer = int(key.split(".")[3])
    if _FP8_MLP.search(key):
        return True
    return layer in _mla_layers(cfg) and bool(_FP8_MLA.search(key))


def build_fp8(src: Path, dst: Path, cfg, block: tuple[int, int] = FP8_BLOCK) -> dict:
    """The checkpoint at ``src`` with the FP8-stored projections quantized to e4m3 with per-block
    inverse scales (``<module>.weight_scale_inv``, fp32), every other tensor unchanged, and
    config.json's quantization_config; processor and tokenizer files copied. Returns the
    quantization_config written."""
    import shutil

    from safetensors.torch import load_file, save_file

    from glm5_next_hpu.vllm.fp8 import BlockFp8Spec, quantize_block_fp8

    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    out: dict[str, torch.Tensor] = {}
    keep: list[str] = []
    for key, t in tensors.items():
        if fp8_stored(key, cfg):
            q, s = quantize_block_fp8(t, block)
            out[key], out[key + "_scale_inv"] = q, s
        else:
            out[key] = t
            if key.endswith(".weight") and t.dim() == 2:
                keep.append(key[: -len(".weight")])
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    qc = BlockFp8Spec(block=block, modules_to_not_convert=tuple(sorted(keep))).to_quantization_config()
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, dst / f.name)
    return qc


def dequantize_with_transformers(
    fp8_dir: Path, dst: Path, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """The FP8 checkpoint dequantized by transformers 5.23.0's own ``Fp8Dequantize`` (the op its
    FP8 integration runs with ``dequantize=True``), written as a plain checkpoint at ``dst`` (no
    quantization_config). Returns the dequantized tensors by key."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    op = Fp8Dequantize(hf_quantizer=None)
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    out, deq = {}, {}
    for key, t in tensors.items():
        if key.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            t = deq[key] = op._dequantize_one(t, tensors[key + "_scale_inv"], output_dtype=dtype)
        out[key] = t
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((fp8_dir / "config.json").read_text())
    config.pop("quantization_config")
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in fp8_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, dst / f.name)
    return deq


def png_data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_message(cfg, images: list, seed: int = 0) -> list[dict]:
    """One user turn: words, then each image followed by words (text before, between, after)."""
    import torch

    g = torch.Generator().manual_seed(2000 + seed)
    words = lambda k: " ".join(f"w{i}" for i in torch.randint(2, 240, (k,), generator=g).tolist())  # noqa: E731
    parts = [{"type": "text", "text": words(5) + " "}]
    for im in images:
        parts += [
            {"type": "image_url", "image_url": {"url": png_data_url(im)}},
            {"type": "text", "text": " " + words(3) + " "},
        ]
    return [{"role": "user", "content": parts}]


def rendered_ids(path, messages) -> list[int]:
    """The port's chat template rendered by transformers and tokenized: one <|image|> per image."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    text = tok.apply_chat_template(
        messages, chat_template=CHAT_TEMPLATE.read_text(), add_generation_prompt=True, tokenize=False
    )
    return tok.encode(text, add_special_tokens=False)
