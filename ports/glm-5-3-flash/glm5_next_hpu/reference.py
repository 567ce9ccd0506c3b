"""The parity model: GLM-5.3-Flash from ``layers/``, top to bottom, with a cache and greedy decode.

This is what the tests compare against transformers 5.23.0 block by block; the served
model is ``vllm/model.py``, built from the same layers. Takes the transformers
``Glm5NextConfig`` object. Module and parameter names follow the checkpoint keys
(``model.language_model.*``, ``model.visual.*``, ``lm_head``).

Layers: KDA (linear attention) or NoPE MLA (dense; the DSA indexer is built and
testable but skipped by default, exact up to ``dense_equals_sparse``), dense or MoE MLP,
both wrapped in mHC streams.
"""

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .config import validate_config
from .layers.kda_layer import KimiDeltaAttention
from .layers.mhc import MhcLayer, add_mhc_parameters
from .layers.mla import MLAAttention
from .layers.moe import decoder_mlp
from .layers.norm import RMSNorm
from .layers.vision import VisionModel
from .mhc import hc_head, hc_post, hc_pre
from .switches import Switches


@dataclass
class Glm5NextCache:
    """Decode state: per KDA layer (conv window, fp32 recurrent state), per MLA layer the
    normalised latent c [B, T, kv_lora_rank]; plus which cached keys are real (not padding)."""

    seq_len: int = 0
    key_valid: torch.Tensor | None = None  # [B, seq_len] bool
    conv: dict = field(default_factory=dict)
    recurrent: dict = field(default_factory=dict)
    latent: dict = field(default_factory=dict)


class ReferenceDecoderLayer(MhcLayer):
    def __init__(self, config, layer_idx: int, kda_scan: bool | None = None, sinkhorn_tpc: bool = False):
        super().__init__()
        self.is_kda = config.layer_types[layer_idx] == "linear_attention"
        self.self_attn: KimiDeltaAttention | MLAAttention
        if self.is_kda:
            self.self_attn = KimiDeltaAttention(config, layer_idx, use_scan=kda_scan)
        else:
            self.self_attn = MLAAttention(config, layer_idx)
        self.mlp = decoder_mlp(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        add_mhc_parameters(self, config)
        self.hc_args = dict(
            rms_eps=config.rms_norm_eps, hc_eps=config.hc_eps, iters=config.hc_sinkhorn_iters, tpc_order=sinkhorn_tpc
        )

    def forward(self, X: torch.Tensor, mask: torch.Tensor, cache: Glm5NextCache | None) -> torch.Tensor:
        """X [B, T, hc_mult, D] streams."""
        post, comb, x = hc_pre(X, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, **self.hc_args)
        X = hc_post(self.self_attn(self.input_layernorm(x), mask, cache), X, post, comb)
        post, comb, x = hc_pre(X, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, **self.hc_args)
        return hc_post(self.mlp(self.post_attention_layernorm(x)), X, post, comb)


class ReferenceTextModel(nn.Module):
    def __init__(self, config, kda_scan: bool | None = None, sinkhorn_tpc: bool = False):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            ReferenceDecoderLayer(config, i, kda_scan, sinkhorn_tpc) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, inputs_embeds: torch.Tensor, mask: torch.Tensor, cache: Glm5NextCache | None) -> torch.Tensor:
        # One token embedding copied into hc_mult streams.
        X = inputs_embeds.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1).contiguous()
        for layer in self.layers:
            X = layer(X, mask, cache)
        return self.norm(hc_head(X))


class ReferenceModel(nn.Module):
    """The checkpoint's ``model.*``: the vision tower and the text model."""

    def __init__(self, config, kda_scan: bool | None = None, sinkhorn_tpc: bool = False):
        super().__init__()
        self.visual = VisionModel(config.vision_config)
        self.language_model = ReferenceTextModel(config.text_config, kda_scan, sinkhorn_tpc)


class Glm5NextReference(nn.Module):
    """Text + image model. ``forward`` returns logits; ``greedy_generate`` decodes with the cache.

    ``switches`` (``switches.read_switches()``) selects the KDA carry and the Sinkhorn
    order as in the vLLM model; None: the kernel's device default for the carry and the
    reference Sinkhorn loop. The vision tower is always built.
    """

    def __init__(self, config, tp_size: int = 1, prefix_caching: bool = False, switches: Switches | None = None):
        super().__init__()
        validate_config(config, tp_size=tp_size, prefix_caching=prefix_caching)
        self.config = config
        kda_scan = switches.kda_scan if switches is not None else None
        sinkhorn_tpc = switches is not None and switches.mhc_sinkhorn == "kernel"
        self.model = ReferenceModel(config, kda_scan, sinkhorn_tpc)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)

    def embed(self, input_ids, pixel_values=None, image_grid_thw=None) -> torch.Tensor:
        emb = self.model.language_model.embed_tokens(input_ids)
        if pixel_values is not None:
            image = self.model.visual(pixel_values, image_grid_thw).to(emb.dtype)
            slots = input_ids == self.config.image_token_id
            if int(slots.sum()) != image.shape[0]:
                raise ValueError(f"{int(slots.sum())} image tokens in the prompt, {image.shape[0]} image embeddings")
            emb = emb.masked_scatter(slots[..., None], image)
        return emb

    def forward(self, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None, cache=None):
        """input_ids [B, T]; attention_mask [B, T] for the new tokens (True/1 = real)."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if cache is not None:
            cache.key_valid = mask if cache.key_valid is None else torch.cat([cache.key_valid, mask], dim=1)
        h = self.model.language_model(self.embed(input_ids, pixel_values, image_grid_thw), mask, cache)
        if cache is not None:
            cache.seq_len += input_ids.shape[1]
        return self.lm_head(h)

    @torch.no_grad()
    def greedy_generate(self, input_ids, max_new_tokens, attention_mask=None, pixel_values=None, image_grid_thw=None):
        """Prefill (chunked KDA) then one recurrent decode step per token. Returns [B, T + new]."""
        cache = Glm5NextCache()
        logits = self(input_ids, attention_mask, pixel_values, image_grid_thw, cache=cache)
        out = [input_ids]
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            logits = self(nxt, cache=cache)
        return torch.cat(out, dim=1)
