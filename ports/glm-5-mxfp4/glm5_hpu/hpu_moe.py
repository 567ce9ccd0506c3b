"""GLM_MOE_TP and GLM_MOE_PLACEMENT on vllm-gaudi's runner: the pieces glm5_hpu/vllm_hpu.py puts
into vLLM's MoE layers (no vLLM import here: they are tested without it).

**GLM_MOE_TP=N** (expert groups of N cards). With ``--enable-expert-parallel`` vLLM gives each of
the TP ranks whole experts (its MoE parallel config: MoE TP 1, EP = the TP size). The layout
replaces that config, per MoE layer, by :func:`group_layout`: MoE TP = N (rank within the group),
EP = TP/N (the group). vLLM's own code then does the rest: its ExpertMapManager gives the group
its consecutive slice of the (stored) experts, its weight loader keeps rank r's
``[r*I/N, (r+1)*I/N)`` rows of gate and up and columns of down (and the scales with them: whole
32-blocks, checked at start-up), and vllm-gaudi's MXFP4 method shifts its expert range by the
group (``ep_rank * local experts``).

Why the output is the whole layer with no extra reduction: each rank's routed output is the sum,
over its group's experts, of its 1/N slice of each expert (silu(gate) * up is elementwise in the
intermediate dimension, and the down projection of a slice is that slice's share of the sum);
the N ranks of a group add up to the group's experts, and the groups to all experts. vLLM's
MoERunner already adds the routed and the shared expert's output on each rank and all-reduces the
sum over the whole TP group once (``_maybe_reduce_final_output``: MoE TP or EP above 1), and that
one all-reduce over all TP ranks is exactly the sum over groups and within groups. The shared
expert is vLLM's tensor-parallel MLP over all TP ranks (``reduce_results=False``), so each rank
holds 1/TP of it and it too is counted once in that sum. One all-reduce per MoE layer, as
without the layout.

**GLM_MOE_PLACEMENT** (glm5_hpu/placement.py): layer L stores expert ``order[s]`` in slot ``s``.
At load each checkpoint expert ``e`` is handed to vLLM's loader as slot ``slots(order)[e]``
(:func:`placed_loader`), so EP and the groups cut the stored order; in the forward the router's
expert ids (logical) go through the same table on the card before the MoE op
(:class:`PlacedMoEOp`), so each token reaches the same experts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from .placement import expert_group


def group_layout(parallel: Any, moe_tp: int) -> Any:
    """vLLM's MoE parallel config (``FusedMoEParallelConfig``) of one rank under expert
    parallelism, made into GLM_MOE_TP=``moe_tp``'s: MoE TP ``moe_tp`` (the rank within its group),
    EP = the number of groups (the group). ``parallel`` must be vLLM's flattened EP config (MoE TP
    1, no data or context parallelism): the start-up check refuses the rest."""
    if moe_tp == 1:
        return parallel
    if not parallel.use_ep or parallel.tp_size != 1 or parallel.dp_size != 1 or parallel.pcp_size != 1:
        raise ValueError(
            f"GLM_MOE_TP={moe_tp}: the expert-group layout needs expert parallelism over the TP ranks only "
            f"(got MoE tp {parallel.tp_size}, dp {parallel.dp_size}, pcp {parallel.pcp_size}, ep {parallel.ep_size}, "
            f"use_ep {parallel.use_ep})"
        )
    group, groups, rank = expert_group(parallel.ep_rank, parallel.ep_size, moe_tp)
    # one group of every card: vLLM's plain tensor-parallel MoE (every expert, sliced), no expert map
    return dataclasses.replace(
        parallel, tp_size=moe_tp, tp_rank=rank, ep_size=groups, ep_rank=group if groups > 1 else 0, use_ep=groups > 1
    )


def placed_loader(loader: Callable[..., Any], slot_of: Sequence[int]) -> Callable[..., Any]:
    """vLLM's expert weight loader with checkpoint expert ``e`` loaded as stored slot ``slot_of[e]``."""

    def load(param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        return loader(
            param,
            loaded_weight,
            weight_name,
            shard_id=shard_id,
            expert_id=slot_of[expert_id],
            return_success=return_success,
        )

    return load


class PlacedMoEOp(torch.nn.Module):
    """The layer's MoE op (vllm-gaudi's stock MXFP4 op or GlmMxkMoEOp) with the router's expert ids
    mapped to the slots that store them: a gather from a table on the card (no host read), then
    the op called as before."""

    def __init__(self, inner: torch.nn.Module, slot_of: Sequence[int], device: torch.device | str):
        super().__init__()
        self.inner = inner
        self.register_buffer("slots", torch.tensor(list(slot_of), dtype=torch.int32, device=device), persistent=False)
        self.slots: torch.Tensor
        op = cast(Any, inner)  # vllm-gaudi's op: its expert range is plain ints, not submodules
        self.experts_min, self.experts_max = int(op.experts_min), int(op.experts_max)

    def forward(self, hidden_states, expert_routing_table, router_weights, permuted_weights=True, activation="silu"):
        ids = expert_routing_table
        slots = self.slots.index_select(0, ids.reshape(-1)).view(ids.shape).to(ids.dtype)
        return self.inner(
            hidden_states, slots, router_weights, permuted_weights=permuted_weights, activation=activation
        )
