"""The vision tower: patch embed, blocks with axial 2D RoPE, RMSNorm, 2 x 2 downsample, merger.

Checkpoint names: ``model.visual.*``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .moe import MLP, clamped_swiglu
from .norm import RMSNorm


class VisionAttention(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.num_heads = vc.num_heads
        self.head_dim = vc.hidden_size // vc.num_heads
        self.qkv = nn.Linear(vc.hidden_size, 3 * vc.hidden_size, bias=vc.attention_bias)
        self.proj = nn.Linear(vc.hidden_size, vc.hidden_size, bias=vc.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, vc.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, vc.rms_norm_eps)

    def forward(self, x: torch.Tensor, cu_seqlens: list[int], cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        L = x.shape[0]
        q, k, v = self.qkv(x).view(L, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = (_rope(t, cos, sin) for t in (q, k))
        out = torch.empty_like(v)
        for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):  # non-causal attention within each image/frame
            qh, kh, vh = (t[s:e].transpose(0, 1) for t in (q, k, v))
            probs = (torch.matmul(qh, kh.transpose(-1, -2)) * self.head_dim**-0.5).softmax(-1, dtype=torch.float32)
            out[s:e] = torch.matmul(probs.to(vh.dtype), vh).transpose(0, 1)
        return self.proj(out.reshape(L, -1))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # NeoX rotate-half, in fp32.
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def _block_major(a: torch.Tensor, m: int) -> torch.Tensor:
    """An [h, w] grid flattened in the order patches arrive: block-major over m x m merge windows."""
    h, w = a.shape
    return a.reshape(h // m, m, w // m, m).transpose(1, 2).flatten()


class VisionBlock(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.norm1 = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.norm2 = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.attn = VisionAttention(vc)
        self.mlp = MLP(vc.hidden_size, vc.intermediate_size, vc.swiglu_limit, bias=vc.attention_bias)

    def forward(self, x, cu_seqlens, cos, sin):
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, vc):
        super().__init__()
        kernel = (vc.temporal_patch_size, vc.patch_size, vc.patch_size)
        self.proj = nn.Conv3d(vc.in_channels, vc.hidden_size, kernel_size=kernel, stride=kernel)
        self.in_channels, self.kernel = vc.in_channels, kernel

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # Kernel = stride = the whole patch, so the conv is one matmul per flattened patch.
        w = self.proj.weight.flatten(1)
        return F.linear(pixels.to(w.dtype).view(-1, w.shape[1]), w, self.proj.bias)


class PatchMerger(nn.Module):
    def __init__(self, dim: int, context_dim: int, limit: float):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.post_projection_norm = nn.LayerNorm(dim)
        self.gate_proj = nn.Linear(dim, context_dim, bias=False)
        self.up_proj = nn.Linear(dim, context_dim, bias=False)
        self.down_proj = nn.Linear(context_dim, dim, bias=False)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.post_projection_norm(self.proj(x)))
        return self.down_proj(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


class VisionModel(nn.Module):
    """Patch embed -> blocks with axial 2D RoPE -> RMSNorm -> 2x2 downsample conv -> merger."""

    inv_freq: torch.Tensor  # a buffer

    def __init__(self, vc):
        super().__init__()
        self.config = vc
        self.merge = vc.spatial_merge_size
        self.patch_embed = PatchEmbed(vc)
        self.blocks = nn.ModuleList(VisionBlock(vc) for _ in range(vc.depth))
        self.post_layernorm = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.downsample = nn.Conv2d(vc.hidden_size, vc.out_hidden_size, kernel_size=self.merge, stride=self.merge)
        self.merger = PatchMerger(vc.out_hidden_size, vc.projection_intermediate_size, vc.swiglu_limit)
        head_dim = vc.hidden_size // vc.num_heads
        theta = (vc.rope_parameters or {}).get("rope_theta", 10000.0)
        spatial = head_dim // 2
        self.register_buffer(
            "inv_freq", 1.0 / theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial), persistent=False
        )

    def rotary(self, grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        parts: list[torch.Tensor] = []
        cu = [0]
        m = self.merge
        for t, h, w in grid_thw.tolist():
            hh = torch.arange(h)[:, None].expand(h, w)
            ww = torch.arange(w)[None, :].expand(h, w)
            parts.append(torch.stack([_block_major(hh, m), _block_major(ww, m)], dim=-1).repeat(t, 1))
            cu.extend(cu[-1] + h * w * (i + 1) for i in range(t))
        pos = torch.cat(parts).to(self.inv_freq.device)  # built on the host; the tower may sit on a device
        freqs = pos[..., None].float() * self.inv_freq  # [L, 2, F]
        angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin(), cu

    def forward(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        cos, sin, cu = self.rotary(grid_thw)
        x = self.patch_embed(pixels)
        for blk in self.blocks:
            x = blk(x, cu, cos, sin)
        x = self.post_layernorm(x)
        x = x.view(-1, self.merge, self.merge, x.shape[-1]).permute(0, 3, 1, 2)
        x = self.downsample(x).view(-1, self.config.out_hidden_size)
        return self.merger(x)
