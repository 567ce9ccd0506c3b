"""glm5_hpu.hpu_moe without vLLM: GLM_MOE_TP's layout as a MoE parallel config, the placement's
loader and op mapping. Through vllm-gaudi's runner (real vLLM MoE layers, worker processes as
ranks): tests/e2e/test_vllm_gaudi_moe_tp.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glm5_hpu import placement
from glm5_hpu.hpu_moe import PlacedMoEOp, group_layout, placed_loader
from glm5_hpu.moe_mxfp4 import MxfpExperts
from packtests.mxfp4_moe import converted_layer, moe_config, reference_moe, reference_route


@dataclasses.dataclass
class Parallel:
    """The fields of vLLM's FusedMoEParallelConfig that the layout reads and writes (vLLM 0.27.0
    fused_moe/config.py), as vLLM makes them under --enable-expert-parallel: MoE TP 1, EP = TP."""

    ep_rank: int
    ep_size: int
    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    pcp_size: int = 1
    use_ep: bool = True
    all2all_backend: str = "allgather_reducescatter"


def test_eight_ranks_at_moe_tp_2_are_four_groups_of_two_consecutive_ranks():
    got = [group_layout(Parallel(r, 8), 2) for r in range(8)]
    assert [(p.ep_rank, p.ep_size, p.tp_rank, p.tp_size, p.use_ep) for p in got] == [
        (r // 2, 4, r % 2, 2, True) for r in range(8)
    ]
    assert all(p.all2all_backend == "allgather_reducescatter" for p in got)  # the rest is vLLM's, kept


def test_one_group_of_every_rank_is_vllms_plain_tensor_parallel_moe():
    got = [group_layout(Parallel(r, 2), 2) for r in range(2)]
    assert [(p.ep_rank, p.ep_size, p.tp_rank, p.tp_size, p.use_ep) for p in got] == [
        (0, 1, 0, 2, False),
        (0, 1, 1, 2, False),
    ]


def test_moe_tp_1_leaves_vllms_config_and_the_rest_is_refused():
    plain = Parallel(3, 8)
    assert group_layout(plain, 1) is plain
    with pytest.raises(ValueError, match=r"GLM_MOE_TP=2: .*expert parallelism over the TP ranks only"):
        group_layout(Parallel(0, 1, tp_size=2, use_ep=False), 2)  # no --enable-expert-parallel
    with pytest.raises(ValueError, match=r"dp 2"):
        group_layout(Parallel(0, 4, dp_size=2), 2)
    with pytest.raises(placement.PlacementError, match=r"GLM_MOE_TP=3 does not divide the 8 cards"):
        group_layout(Parallel(0, 8), 3)


def _card(ckpt, prefix, parallel, order):
    """What vLLM's loader puts on a card with this MoE parallel config: the EP group's consecutive
    slice of the stored order (ExpertMapManager, linear), the MoE-TP rank's 1/N of the
    intermediate dimension (RoutedExperts._load_w13/_load_w2: gate/up rows, down columns)."""
    size = len(order) // parallel.ep_size
    experts = order[parallel.ep_rank * size : (parallel.ep_rank + 1) * size]
    return MxfpExperts.from_checkpoint(ckpt, prefix, experts, tp=(parallel.tp_rank, parallel.tp_size))


@pytest.mark.parametrize(("world", "moe_tp"), [(8, 2), (4, 2), (2, 2), (8, 4)])
def test_the_cards_of_the_layout_add_up_to_the_whole_layer_once(world, moe_tp):
    """Summed over every rank (the one all-reduce vLLM's MoERunner does over the TP group), the
    routed outputs of the layout's cards are the whole layer's (fp32; another summation order:
    within 1e-6 of the largest magnitude); each expert is on exactly GLM_MOE_TP cards."""
    cfg = moe_config(inter=128)  # 4 parts of whole 32-blocks at GLM_MOE_TP=4
    moe = reference_moe(cfg, torch.float32)
    ckpt, prefix = converted_layer(moe), "model.layers.1.mlp"
    order = torch.randperm(16, generator=torch.Generator().manual_seed(world + moe_tp)).tolist()
    x = torch.randn(24, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    w, ids = reference_route(moe, x)
    whole = MxfpExperts.from_checkpoint(ckpt, prefix, range(16)).forward(x, ids, w)
    total, held = torch.zeros_like(whole), []
    for rank in range(world):
        card = _card(ckpt, prefix, group_layout(Parallel(rank, world), moe_tp), order)
        assert card.w2.shape[-1] * 2 == cfg.moe_intermediate_size // moe_tp
        held += card.experts
        total += card.forward(x, ids, w)
    assert sorted(held) == sorted(moe_tp * list(range(16)))
    assert float((total - whole).abs().max()) <= 1e-6 * float(whole.abs().max())


def test_negative_control_both_cards_of_a_group_on_the_same_slice_do_not_add_up():
    cfg = moe_config()
    moe = reference_moe(cfg, torch.float32)
    ckpt, prefix = converted_layer(moe), "model.layers.1.mlp"
    x = torch.randn(24, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    w, ids = reference_route(moe, x)
    whole = MxfpExperts.from_checkpoint(ckpt, prefix, range(16)).forward(x, ids, w)
    wrong = sum(
        _card(ckpt, prefix, dataclasses.replace(group_layout(Parallel(r, 4), 2), tp_rank=0), list(range(16))).forward(
            x, ids, w
        )
        for r in range(4)
    )
    assert float((wrong - whole).abs().max()) > 1e-2 * float(whole.abs().max())


def test_the_loader_stores_checkpoint_expert_e_in_its_slot():
    calls = []

    def vllm_loader(param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        calls.append((weight_name, shard_id, expert_id, return_success))
        return expert_id < 4  # this rank holds slots 0..3

    order = [5, 2, 7, 0, 1, 6, 3, 4]
    load = placed_loader(vllm_loader, placement.slots(order))
    assert [load(None, None, "w13", shard_id="w1", expert_id=e, return_success=True) for e in range(8)] == [
        e in order[:4] for e in range(8)
    ]
    assert [c[2] for c in calls] == [order.index(e) for e in range(8)]
    assert placement.slots(order) == [order.index(e) for e in range(8)]
    with pytest.raises(placement.PlacementError, match="not a permutation"):
        placement.slots([0, 0, 1])


class _Recorder(torch.nn.Module):
    experts_min, experts_max = 4, 7

    def forward(self, hidden_states, expert_routing_table, router_weights, permuted_weights=True, activation="silu"):
        self.got = (expert_routing_table, permuted_weights, activation)
        return hidden_states


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_the_op_sends_each_router_choice_to_the_slot_of_its_expert(dtype):
    order = [5, 2, 7, 0, 1, 6, 3, 4]
    inner = _Recorder()
    op = PlacedMoEOp(inner, placement.slots(order), "cpu")
    ids = torch.tensor([[0, 7], [5, 3], [4, 4]], dtype=dtype)
    x = torch.randn(3, 8)
    assert op(x, ids, torch.ones(3, 2), activation="silu") is x
    mapped, permuted, act = inner.got
    assert mapped.dtype == dtype and permuted is True and act == "silu"
    # slot s stores order[s]: the stored expert the op reaches is the one the router named
    assert [[order[s] for s in row] for row in mapped.tolist()] == ids.tolist()
    assert (op.experts_min, op.experts_max) == (4, 7)


def test_placed_moe_is_the_same_moe_bit_for_bit_at_top_2():
    """A MoE op on stored-order experts behind PlacedMoEOp equals the same op on the checkpoint
    order: with two choices per token the float32 sum of two terms does not depend on their order
    (the emulated stock op adds a token's experts in slot order)."""
    cfg = moe_config(top_k=2)
    moe = reference_moe(cfg, torch.bfloat16)
    ckpt, prefix = converted_layer(moe), "model.layers.1.mlp"
    order = torch.randperm(16, generator=torch.Generator().manual_seed(3)).tolist()
    plain = MxfpExperts.from_checkpoint(ckpt, prefix, range(16))
    stored = MxfpExperts.from_checkpoint(ckpt, prefix, order)
    stored.slot = {s: s for s in range(16)}  # the op on the card knows slots only

    class SlotOp(torch.nn.Module):
        experts_min, experts_max = 0, 15  # one card, every slot

        def forward(
            self, hidden_states, expert_routing_table, router_weights, permuted_weights=True, activation="silu"
        ):
            return stored.forward(hidden_states, expert_routing_table.long(), router_weights)

    x = torch.randn(20, cfg.hidden_size).to(torch.bfloat16)
    w, ids = reference_route(moe, x, top_k=2)
    w = w.to(torch.bfloat16)
    want = plain.forward(x, ids, w)
    assert torch.equal(PlacedMoEOp(SlotOp(), placement.slots(order), "cpu")(x, ids.to(torch.int32), w), want)
    assert not torch.equal(SlotOp()(x, ids, w), want)  # the ids unmapped reach other experts
