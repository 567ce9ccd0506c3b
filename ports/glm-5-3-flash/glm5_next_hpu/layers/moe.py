"""The MLPs: dense SwiGLU with GLM's clamp, and the routed MoE block with its shared expert."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    # GLM clamps the gate from above only, before silu, and the up projection both ways.
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


class MLP(nn.Module):
    """Dense SwiGLU MLP with the swiglu_limit clamp (dense layers, shared expert, vision)."""

    def __init__(self, hidden: int, intermediate: int, limit: float, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


class Router(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size))
        # fp32 whatever the default dtype (transformers' _keep_in_fp32_modules_strict): the bias
        # only reorders near-tied sigmoid scores, and bf16 (8 bits of mantissa) merges such ties.
        self.e_score_correction_bias = nn.Parameter(
            torch.zeros(config.n_routed_experts, dtype=torch.float32), requires_grad=False
        )
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.scale = config.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (weights [T, top_k] fp32, expert ids [T, top_k])."""
        # fp32 routing: bf16 logits flip near-tied experts.
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        # The correction bias steers *selection* only; the weights are the unbiased scores.
        choice = scores + self.e_score_correction_bias.float()
        if self.n_group > 1:
            grouped = choice.view(x.shape[0], self.n_group, -1)
            group_score = grouped.topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(self.topk_group, dim=-1).indices, 1.0)
            choice = choice.masked_fill(~keep.bool().repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        ids = choice.topk(self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scale, ids


class Experts(nn.Module):
    """Routed experts stacked as vLLM's FusedMoE holds them: w13 = [gate; up], w2 = down."""

    def __init__(self, config):
        super().__init__()
        E, D, inter = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.w13_weight = nn.Parameter(torch.zeros(E, 2 * inter, D))
        self.w2_weight = nn.Parameter(torch.zeros(E, D, inter))
        self.limit = config.swiglu_limit

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            tok, slot = torch.where(ids == e)
            gate, up = F.linear(x[tok], self.w13_weight[e]).chunk(2, dim=-1)
            y = F.linear(clamped_swiglu(gate, up, self.limit), self.w2_weight[e])
            out.index_add_(0, tok, (y * weights[tok, slot, None]).to(x.dtype))
        return out


class MoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = Router(config)
        self.experts = Experts(config)
        self.shared_experts = MLP(
            config.hidden_size, config.moe_intermediate_size * config.n_shared_experts, config.swiglu_limit
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat)
        # The shared expert is added unscaled (routed_scaling_factor applies to routed weights only).
        return self.experts(flat, weights, ids).view_as(x) + self.shared_experts(x)


def decoder_mlp(config, layer_idx: int) -> nn.Module:
    """The MLP of decoder layer ``layer_idx``: the MoE block or the dense MLP."""
    if config.mlp_layer_types[layer_idx] == "sparse":
        return MoE(config)
    return MLP(config.hidden_size, config.intermediate_size, config.swiglu_limit)
