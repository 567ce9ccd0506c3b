"""The KDA (Kimi Delta Attention) layer of the parity model, with GLM's bounded gate.

q/k/v projections -> short causal conv + silu -> gate g and beta -> KDA (chunked
prefill, or the recurrent step when decoding one token on a cached state) -> gated
RMSNorm -> o_proj. Checkpoint names: ``layers.{i}.self_attn.*``.
"""

from typing import Any

import torch
import torch.nn as nn

from ..kda import causal_conv1d, chunk_kda, fused_recurrent_kda, gated_rms_norm, kda_gate
from .norm import RMSNorm


class KimiDeltaAttention(nn.Module):
    """``use_scan`` is handed to ``chunk_kda``: True the Hillis-Steele carry, False the
    sequential one, None the kernel's default for the device."""

    def __init__(self, config, layer_idx: int, use_scan: bool | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.use_scan = use_scan
        D, H, K = config.hidden_size, config.linear_num_heads, config.linear_head_dim
        W = config.linear_conv_kernel_dim
        self.num_heads, self.head_dim = H, K
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, H * K, bias=False)
        self.v_proj = nn.Linear(D, H * K, bias=False)
        self.q_conv1d = nn.Conv1d(H * K, H * K, W, groups=H * K, bias=False)
        self.k_conv1d = nn.Conv1d(H * K, H * K, W, groups=H * K, bias=False)
        self.v_conv1d = nn.Conv1d(H * K, H * K, W, groups=H * K, bias=False)
        self.f_a_proj = nn.Linear(D, K, bias=False)
        self.f_b_proj = nn.Linear(K, H * K, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(H * K))
        self.A_log = nn.Parameter(torch.zeros(H))  # flat [H], as on disk
        self.b_proj = nn.Linear(D, H, bias=False)
        self.g_a_proj = nn.Linear(D, K, bias=False)
        self.g_b_proj = nn.Linear(K, H * K, bias=False)
        self.o_norm = RMSNorm(K, config.rms_norm_eps)
        self.o_proj = nn.Linear(H * K, D, bias=False)
        self.lower_bound = config.linear_lower_bound

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache=None) -> torch.Tensor:
        """x [B, T, D]; mask [B, T] (True = real token); cache: a ``reference.Glm5NextCache`` or None."""
        B, T, _ = x.shape
        # Padding must not reach the recurrence. torch.where (not a multiply) also clears NaN
        # in padded slots: 0 * NaN = NaN would poison every later query.
        x = torch.where(mask[..., None], x, torch.zeros((), dtype=x.dtype))
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1).transpose(1, 2)
        weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight], dim=0).squeeze(1)
        conv_state = cache.conv.get(self.layer_idx) if cache is not None else None
        qkv, new_conv_state = causal_conv1d(qkv, weight, conv_state)
        q, k, v = qkv.transpose(1, 2).reshape(B, T, 3, self.num_heads, self.head_dim).unbind(2)

        g = kda_gate(self.f_b_proj(self.f_a_proj(x)), self.A_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(self.b_proj(x))
        state = cache.recurrent.get(self.layer_idx) if cache is not None else None
        kw: dict[str, Any] = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True, mask=mask)
        if state is not None and T == 1:
            o, state = fused_recurrent_kda(q, k, v, g, beta, **kw)
        else:
            o, state = chunk_kda(q, k, v, g, beta, **kw, use_scan=self.use_scan)
        if cache is not None:
            cache.conv[self.layer_idx] = new_conv_state
            cache.recurrent[self.layer_idx] = state

        gate = self.g_b_proj(self.g_a_proj(x)).view(B, T, self.num_heads, self.head_dim)
        o = gated_rms_norm(o, gate, self.o_norm.weight, self.o_norm.eps)
        return self.o_proj(o.to(x.dtype).reshape(B, T, -1))
