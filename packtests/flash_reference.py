"""Builders shared by the parity tests: a tiny transformers reference, its checkpoint-format
tensors, the port loaded from those tensors, adversarial KDA inputs, and comparisons."""

import tempfile
from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Glm5NextConfig
from transformers.models.glm5_next import modeling_glm5_next as ref

from glm5_next_hpu.reference import Glm5NextReference
from glm5_next_hpu.weights import load_weights

IMAGE_TOKEN = 250


def tiny_config(index_topk: int = 128, layers: int = 4) -> Glm5NextConfig:
    """KDA and MLA layers, dense and MoE MLPs, a vision tower whose output fits the text width."""
    layer_types = ["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"][:layers]
    mlp_types = ["dense", "sparse", "sparse", "dense"][:layers]
    text = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        routed_scaling_factor=2.5,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_nope_head_dim=16,
        v_head_dim=16,
        qk_rope_head_dim=0,
        index_topk=index_topk,
        index_head_dim=16,
        index_n_heads=4,
        index_kpool=4,
        linear_num_heads=4,
        linear_head_dim=16,
        linear_conv_kernel_dim=4,
        linear_lower_bound=-5.0,
        layer_types=layer_types,
        mlp_layer_types=mlp_types,
        pad_token_id=0,
        eos_token_id=None,
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        num_heads=2,
        intermediate_size=64,
        out_hidden_size=64,
        projection_intermediate_size=64,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
    )
    cfg = Glm5NextConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        image_start_token_id=248,
        image_end_token_id=249,
        video_start_token_id=246,
        video_end_token_id=247,
        video_token_id=245,
    )
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    cfg.text_config._experts_implementation = "eager"
    return cfg


@torch.no_grad()
def unhide(model: torch.nn.Module, seed: int) -> None:
    """Re-randomise what the reference initialises to values that hide bugs.

    A_log = 0 makes GLM's and Kimi's gate closer; mHC base = 0 / scale = 1, a zero router
    bias and unit norms each make a wrong formula coincide with the right one.
    """
    g = torch.Generator().manual_seed(seed)
    rnd = lambda t, s=1.0: torch.randn(t.shape, generator=g) * s  # noqa: E731
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(rnd(p, 1.0))
        elif name.endswith("dt_bias"):
            p.copy_(rnd(p, 1.0) + 1.0)  # mostly saturating gates
        elif name.endswith(("attn_hc.base", "ffn_hc.base")):
            p.copy_(rnd(p, 0.5))
        elif name.endswith(("attn_hc.scale", "ffn_hc.scale")):
            p.copy_(1.0 + rnd(p, 0.3))
        elif name.endswith(("attn_hc.fn", "ffn_hc.fn")):
            p.copy_(rnd(p, 0.05))
        elif "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + rnd(p, 0.2))
        elif "norm" in name and name.endswith("bias"):
            p.copy_(rnd(p, 0.1))
        elif name.endswith(("index_kpool_compress_ape", "index_kpool_compress_gate")):
            p.copy_(rnd(p, 0.1))
        elif "conv1d" in name:
            p.copy_(rnd(p, 0.5))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(rnd(b, 0.3))


def build_reference(seed: int = 0, **kw) -> tuple[torch.nn.Module, Glm5NextConfig]:
    torch.manual_seed(seed)
    cfg = tiny_config(**kw)
    model = ref.Glm5NextForConditionalGeneration(cfg).eval()
    unhide(model, seed + 1)
    return model, cfg


def checkpoint_tensors(model) -> dict[str, torch.Tensor]:
    """The reference's own checkpoint-format state dict (save_pretrained runs the reverse conversion)."""
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        out = {}
        import glob

        for f in sorted(glob.glob(f"{d}/*.safetensors")):
            with safe_open(f, "pt") as fh:
                for k in fh.keys():
                    out[k] = fh.get_tensor(k)
    return out


@dataclass
class Pair:
    ref: torch.nn.Module
    port: Glm5NextReference
    config: Glm5NextConfig
    ckpt: dict


def build_pair(seed: int = 0, **kw) -> Pair:
    model, cfg = build_reference(seed, **kw)
    ckpt = checkpoint_tensors(model)
    port = Glm5NextReference(cfg).eval()
    load_weights(port, ckpt.items())
    return Pair(model, port, cfg, ckpt)


def image_inputs(seed: int = 0, grid=(1, 8, 8), prefix: int = 5, suffix: int = 7, batch: int = 1):
    """A prompt with one image: grid t x h x w patches -> t*h*w/4 image tokens."""
    g = torch.Generator().manual_seed(seed)
    t, h, w = grid
    n_patches = t * h * w
    pixels = torch.randn(n_patches * batch, 3 * 2 * 14 * 14, generator=g)
    n_img = n_patches // 4
    ids = torch.randint(1, 240, (batch, prefix + n_img + suffix), generator=g)
    ids[:, prefix : prefix + n_img] = IMAGE_TOKEN
    grid_thw = torch.tensor([list(grid)] * batch)
    return ids, pixels, grid_thw


# ----------------------------------------------------------------------------- KDA inputs


def kda_inputs(regime: str, B=1, T=256, H=2, K=32, V=32, seed=0):
    """Inputs for the KDA kernels in a named regime.

    random       unit-scale keys, beta ~ U(0,1), moderate gates
    saturated    gate at the -5 bound: within-chunk cumulative gate reaches about -300
    adversarial  strongly correlated keys, beta near 1, weak decay: breaks unstable inverses
    """
    g_ = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g_)  # noqa: E731
    q, v = r(B, T, H, K), r(B, T, H, V)
    if regime == "random":
        k = r(B, T, H, K)
        beta = torch.rand(B, T, H, generator=g_)
        g = -5 * torch.sigmoid(r(B, T, H, K))
    elif regime == "saturated":
        k = r(B, T, H, K)
        beta = torch.rand(B, T, H, generator=g_)
        g = -5 * torch.sigmoid(8 + r(B, T, H, K))
    elif regime == "adversarial":
        base = r(1, 1, H, K)
        k = 0.97 * base + 0.03 * r(B, T, H, K)
        beta = 0.98 + 0.02 * torch.rand(B, T, H, generator=g_)
        g = -0.01 * torch.sigmoid(r(B, T, H, K))
    else:
        raise ValueError(regime)
    return q, k, v, g, beta


def nonfinite(x: torch.Tensor) -> int:
    return int((~torch.isfinite(x)).sum())


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


class OpCount(TorchDispatchMode):
    """Counts every aten op that reaches the dispatcher (what ran, not what was configured)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))
