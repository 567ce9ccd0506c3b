"""The MXFP4 MoE of glm_moe_dsa, reference path (PyTorch, any device; what GLM_MXK=0 selects).

Routed experts are held as the converter wrote them (glm5_mxfp4, per expert: ``.weight`` U8
[out, in/2], E2M1 with element 2i in the low nibble, and ``.weight_scale`` U8 [out, in/32],
E8M0, one scale per 32 along the input axis), stacked per layer the way vLLM stacks them:
``w13`` [E, 2I, H/2] (gate rows, then up rows) and ``w2`` [E, H, I/2], each with its scales.
Nothing is dequantized ahead of time: each expert's blocks are decoded when a token reaches it,
one expert at a time, so the layer's memory stays the packed size plus one expert in the
activation dtype.

The decode is the converter's, bit for bit: ``glm5_mxfp4.mxfp4.dequantize`` in torch (the test
compares every byte value under every scale code). The router and the combine follow
transformers 5.23.0's GlmMoeDsaMoE: fp32 sigmoid scores, ``e_score_correction_bias`` added for
the choice only, group-limited top-k, weights taken from the unbiased scores, normalised, times
``routed_scaling_factor``; each token's expert outputs are summed in ascending expert id, so the
result does not depend on where the experts are stored (glm5_hpu/placement.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from glm5_mxfp4.mxfp4 import BLOCK, E2M1_VALUES

PROJ = ("gate_proj", "up_proj", "down_proj")


def _e2m1_table() -> torch.Tensor:
    """The 16 E2M1 codes as float32: bits 0-2 the magnitude, bit 3 the sign (code 8 is -0)."""
    mag = torch.from_numpy(E2M1_VALUES.copy())
    return torch.cat([mag, -mag])


def _e8m0_table() -> torch.Tensor:
    """The 256 E8M0 codes as float32 2**(code - 127), built from the exponent bits: code 0 is
    2**-127 (a float32 subnormal, 0x00400000), code 255 is NaN, as the converter decodes them."""
    bits = torch.arange(256, dtype=torch.int64) << 23
    bits[0] = 0x00400000
    table = bits.to(torch.int32).view(torch.float32).clone()
    table[255] = float("nan")
    return table


E2M1 = _e2m1_table()
E8M0 = _e8m0_table()


def dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(U8 [..., K/2], U8 [..., K/32]) -> ``dtype`` [..., K]; float32 is glm5_mxfp4's output bit
    for bit, and the values of real weights are exact in bf16 too (a product of a 2-bit mantissa
    and a power of two)."""
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"packed {packed.dtype} and scales {scales.dtype} must both be uint8")
    k = packed.shape[-1] * 2
    if scales.shape[:-1] != packed.shape[:-1] or scales.shape[-1] * BLOCK != k:
        raise ValueError(
            f"packed {tuple(packed.shape)} and scales {tuple(scales.shape)} do not match (blocks of {BLOCK})"
        )
    lut = E2M1.to(packed.device)
    lo = lut[(packed & 0x0F).long()]
    hi = lut[(packed >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], k // BLOCK, BLOCK)
    factor = E8M0.to(packed.device)[scales.long()]
    return (vals * factor.unsqueeze(-1)).reshape(*packed.shape[:-1], k).to(dtype)


class MxfpExperts:
    """One MoE layer's routed experts, packed MXFP4, in storage order.

    ``experts[s]`` is the logical expert id held in storage slot ``s``: the checkpoint's order,
    the local expert group of an expert-parallel rank, or a placement's order. Logical ids not
    held here contribute nothing (another rank holds them)."""

    def __init__(
        self,
        experts: Sequence[int],
        w13: torch.Tensor,
        w13_scale: torch.Tensor,
        w2: torch.Tensor,
        w2_scale: torch.Tensor,
    ):
        experts = [int(e) for e in experts]
        if len(set(experts)) != len(experts):
            raise ValueError("an expert is stored twice")
        n = len(experts)
        h, i = w13.shape[-1] * 2, w13.shape[-2] // 2
        want = {
            "w13": (n, 2 * i, h // 2),
            "w13_scale": (n, 2 * i, h // BLOCK),
            "w2": (n, h, i // 2),
            "w2_scale": (n, h, i // BLOCK),
        }
        for name, t in (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale)):
            if t.dtype != torch.uint8 or tuple(t.shape) != want[name]:
                raise ValueError(f"{name}: {t.dtype} {tuple(t.shape)}, expected uint8 {want[name]}")
        self.experts = experts
        self.slot = {x: s for s, x in enumerate(experts)}
        self.hidden, self.intermediate = h, i
        self.w13, self.w13_scale, self.w2, self.w2_scale = w13, w13_scale, w2, w2_scale

    @classmethod
    def from_checkpoint(
        cls,
        get: Callable[[str], torch.Tensor] | Mapping[str, torch.Tensor],
        prefix: str,
        experts: Sequence[int],
        tp: tuple[int, int] = (0, 1),
    ) -> MxfpExperts:
        """Load ``experts`` (logical ids, in the storage order wanted) from the converter's keys
        ``{prefix}.experts.{e}.{gate,up,down}_proj.weight`` and ``.weight_scale``; ``prefix`` is
        ``model.layers.{L}.mlp``. Reads only those experts: one expert group per rank.

        ``tp`` = (rank, size) within the expert group (GLM_MOE_TP = size): this card keeps
        rows [rank*I/size, (rank+1)*I/size) of gate and up and the same columns of down, whole
        blocks of 32 only; the group's cards' outputs add up to the whole experts' output."""
        read = get.__getitem__ if isinstance(get, Mapping) else get
        rank, size = tp
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"tp {tp}: rank must be in 0..size-1 and size at least 1")
        w13, s13, w2, s2 = [], [], [], []
        for e in experts:
            t = {}
            for p in PROJ:
                key = f"{prefix}.experts.{e}.{p}"
                try:
                    t[p] = (read(f"{key}.weight"), read(f"{key}.weight_scale"))
                except KeyError:
                    raise KeyError(f"{key}.weight / .weight_scale: not in the checkpoint (expert {e})") from None
            inter = t["gate_proj"][0].shape[0]
            if inter % (size * BLOCK):
                raise ValueError(
                    f"{prefix}.experts.{e}: intermediate size {inter} does not split into {size} "
                    f"parts of whole {BLOCK}-blocks (GLM_MOE_TP={size})"
                )
            part = inter // size
            rows = slice(rank * part, (rank + 1) * part)
            w13.append(torch.cat([t["gate_proj"][0][rows], t["up_proj"][0][rows]]))
            s13.append(torch.cat([t["gate_proj"][1][rows], t["up_proj"][1][rows]]))
            w2.append(t["down_proj"][0][:, rank * part // 2 : (rank + 1) * part // 2])
            s2.append(t["down_proj"][1][:, rank * part // BLOCK : (rank + 1) * part // BLOCK])
        return cls(
            experts, torch.stack(w13), torch.stack(s13), torch.stack(w2).contiguous(), torch.stack(s2).contiguous()
        )

    def weights(self, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Logical expert ``expert``'s (w13 [2I, H], w2 [H, I]), decoded now, in ``dtype``."""
        s = self.slot[expert]
        return (dequantize(self.w13[s], self.w13_scale[s], dtype), dequantize(self.w2[s], self.w2_scale[s], dtype))

    def forward(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        act: Callable[[torch.Tensor], torch.Tensor] = F.silu,
    ) -> torch.Tensor:
        """x [T, H]; ids, weights [T, K] from :func:`route`. Each expert that some token chose is
        decoded and applied to its tokens; a token's outputs are added in ascending expert id
        (the same sums in the same order wherever the experts are stored)."""
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():  # ascending
            if e not in self.slot:
                continue
            kpos, tok = torch.nonzero(ids.t() == e, as_tuple=True)
            w13, w2 = self.weights(e, x.dtype)
            gate, up = F.linear(x[tok], w13).chunk(2, dim=-1)
            y = F.linear(act(gate) * up, w2) * weights[tok, kpos, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


def route(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """glm_moe_dsa routing of x [T, H]: (weights fp32 [T, K], expert ids [T, K]).

    Scores are sigmoid(x W^T) in fp32. The correction bias only chooses: it is added to pick the
    groups (each group's two best biased scores summed, the best ``topk_group`` groups kept) and
    the top-k experts within them; the weights are the unbiased scores of those experts,
    divided by their sum when ``norm_topk_prob``, times ``routed_scaling_factor``."""
    t, e = x.shape[0], gate_weight.shape[0]
    if e % n_group:
        raise ValueError(f"{e} experts do not split into {n_group} groups")
    scores = F.linear(x.float(), gate_weight.float()).sigmoid()
    choice = scores + bias.float()
    if n_group > 1:
        best2 = choice.view(t, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(best2, dtype=torch.bool)
        keep.scatter_(1, best2.topk(topk_group, dim=-1, sorted=False).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


class GlmMoeMxfp4(torch.nn.Module):
    """A glm_moe_dsa MoE layer with MXFP4 routed experts: router, routed experts, shared expert.

    ``shared`` holds the shared expert's bf16 ``gate_proj``, ``up_proj``, ``down_proj`` [out, in]
    (n_shared_experts of them are one wider MLP in the checkpoint)."""

    def __init__(
        self,
        config,
        gate_weight: torch.Tensor,
        bias: torch.Tensor,
        experts: MxfpExperts,
        shared: Mapping[str, torch.Tensor],
    ):
        super().__init__()
        if bias.dtype != torch.float32:
            raise TypeError(f"e_score_correction_bias is {bias.dtype}; the release keeps it in float32")
        self.cfg = dict(
            top_k=config.num_experts_per_tok,
            n_group=config.n_group,
            topk_group=config.topk_group,
            norm_topk_prob=config.norm_topk_prob,
            routed_scaling_factor=config.routed_scaling_factor,
        )
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r}: glm_moe_dsa uses silu")
        self.gate_weight, self.bias, self.experts, self.shared = gate_weight, bias, experts, dict(shared)
        # called with each forward's expert ids [T, K]: the placement fitter counts the routing
        # the forward itself computes (glm5_hpu/placement_fit.py), not a second copy of it
        self.on_route: Callable[[torch.Tensor], None] | None = None

    @classmethod
    def from_checkpoint(cls, config, get, layer: int, experts: Sequence[int] | None = None) -> GlmMoeMxfp4:
        """Layer ``layer``'s MoE from the converted checkpoint (``get``: a mapping or a key reader);
        ``experts``: the logical ids to hold, in storage order (default all, checkpoint order)."""
        read = get.__getitem__ if isinstance(get, Mapping) else get
        prefix = f"model.layers.{layer}.mlp"
        experts = range(config.n_routed_experts) if experts is None else experts
        shared = {p: read(f"{prefix}.shared_experts.{p}.weight") for p in PROJ}
        return cls(
            config,
            read(f"{prefix}.gate.weight"),
            read(f"{prefix}.gate.e_score_correction_bias"),
            MxfpExperts.from_checkpoint(read, prefix, experts),
            shared,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        weights, ids = route(x, self.gate_weight, self.bias, **self.cfg)
        if self.on_route is not None:
            self.on_route(ids)
        routed = self.experts.forward(x, ids, weights)
        s = self.shared
        shared = F.linear(F.silu(F.linear(x, s["gate_proj"])) * F.linear(x, s["up_proj"]), s["down_proj"])
        return (routed + shared).reshape(shape)
