"""The expert placement file (GLM_MOE_PLACEMENT): where each MoE layer's experts are stored.

A placement is, per MoE layer, a permutation of the routed experts: the order in which the
layer stores them. With expert parallelism the stored order is cut into equal consecutive
groups, one per expert group of cards, so a placement decides which experts share a card; one
fitted to the model's routing (``python -m glm5_hpu.placement_fit``) spreads the busiest experts
over the cards. It changes storage
only: the router still names logical experts, and each token's expert outputs are combined in
logical order (glm5_hpu/moe_mxfp4.py), so any valid permutation gives the same output. A file
fitted to another model is slower, never wrong; a file that is not a permutation is refused.

The file is JSON::

    {
      "format": "glm5-moe-placement/1",
      "n_routed_experts": 256,
      "layers": {"3": [17, 250, 4, ...], "4": [...], ...}
    }

``layers`` maps a MoE layer id (decimal, as in ``model.layers.{L}``; the MTP layer included) to
its 256 expert ids, each exactly once; slot s stores expert ``layers[L][s]``. A layer left out
keeps the checkpoint's order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FORMAT = "glm5-moe-placement/1"


class PlacementError(ValueError):
    """A placement file that cannot be used; the message names the file, the layer, the expert."""


def moe_layers(config) -> list[int]:
    """The MoE layer ids of ``config``: the sparse decoder layers, then the MTP layers."""
    n = config.num_hidden_layers
    kinds = getattr(config, "mlp_layer_types", None) or [
        "dense" if i < config.first_k_dense_replace else "sparse" for i in range(n)
    ]
    mtp = getattr(config, "num_nextn_predict_layers", 0) or 0
    return [i for i in range(n) if kinds[i] == "sparse"] + list(range(n, n + mtp))


@dataclass(frozen=True)
class Placement:
    n_experts: int
    layers: dict[int, tuple[int, ...]]
    source: str = "identity"

    def order(self, layer: int) -> list[int]:
        """Layer ``layer``'s stored order: slot s holds expert order[s]."""
        return list(self.layers.get(layer, range(self.n_experts)))

    def group(self, layer: int, n_groups: int, index: int) -> list[int]:
        """The experts expert group ``index`` of ``n_groups`` stores, in slot order."""
        if n_groups < 1 or self.n_experts % n_groups:
            raise PlacementError(f"{self.n_experts} experts do not split into {n_groups} equal expert groups")
        if not 0 <= index < n_groups:
            raise PlacementError(f"expert group {index} is not one of 0..{n_groups - 1}")
        size = self.n_experts // n_groups
        return self.order(layer)[index * size : (index + 1) * size]


def expert_group(rank: int, world: int, moe_tp: int) -> tuple[int, int, int]:
    """Card ``rank`` of ``world`` under GLM_MOE_TP=``moe_tp``: (expert group, number of groups,
    rank within the group). 8 cards at GLM_MOE_TP=2: 4 groups of 2 consecutive cards."""
    if moe_tp < 1 or world % moe_tp:
        raise PlacementError(f"GLM_MOE_TP={moe_tp} does not divide the {world} cards")
    if not 0 <= rank < world:
        raise PlacementError(f"rank {rank} is not one of 0..{world - 1}")
    return rank // moe_tp, world // moe_tp, rank % moe_tp


def slots(order: list[int] | tuple[int, ...]) -> list[int]:
    """The inverse of a stored order: ``slots(order)[e]`` is the slot that stores expert ``e``
    (what a router's expert id is mapped through to reach the stored tensors)."""
    inverse = [-1] * len(order)
    for s, e in enumerate(order):
        if not 0 <= e < len(order) or inverse[e] != -1:
            raise PlacementError(f"{list(order)} is not a permutation of 0..{len(order) - 1}")
        inverse[e] = s
    return inverse


def identity(config) -> Placement:
    return Placement(config.n_routed_experts, {})


def load(path: str | Path, config) -> Placement:
    """Read and check a placement file against ``config``; PlacementError names what is wrong."""
    path = Path(path)
    where = str(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise PlacementError(f"{where}: cannot read the placement file: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlacementError(f"{where}: not JSON: {exc}") from None
    return check(data, config, where)


def check(data: object, config, where: str = "placement") -> Placement:
    """A parsed placement as a :class:`Placement`, every rule checked."""
    n = config.n_routed_experts
    if not isinstance(data, dict):
        raise PlacementError(f"{where}: the top level must be an object with format, n_routed_experts, layers")
    unknown = sorted(set(data) - {"format", "n_routed_experts", "layers", "model", "note"})
    if unknown:
        raise PlacementError(f"{where}: unknown key(s) {', '.join(unknown)}")
    if data.get("format") != FORMAT:
        raise PlacementError(f"{where}: format is {data.get('format')!r}, expected {FORMAT!r}")
    count = data.get("n_routed_experts")
    if count != n or isinstance(count, bool):
        raise PlacementError(f"{where}: n_routed_experts is {count!r}; the model has {n} routed experts")
    layers = data.get("layers")
    if not isinstance(layers, dict):
        raise PlacementError(f"{where}: 'layers' must be an object mapping a MoE layer id to its expert order")
    valid = moe_layers(config)
    out: dict[int, tuple[int, ...]] = {}
    for key, order in layers.items():
        if not (isinstance(key, str) and key.isdecimal() and str(int(key)) == key):
            raise PlacementError(f"{where}: layer {key!r}: a layer id is a decimal number without leading zeros")
        layer = int(key)
        at = f"{where}: layer {layer}"
        if layer not in valid:
            what = "a dense layer" if layer < config.num_hidden_layers else "not a layer of this model"
            raise PlacementError(f"{at}: {what} (MoE layers: {_ranges(valid)})")
        if not isinstance(order, list):
            raise PlacementError(f"{at}: the expert order must be a list of {n} expert ids")
        seen: dict[int, int] = {}
        for slot, e in enumerate(order):
            if not isinstance(e, int) or isinstance(e, bool):
                raise PlacementError(f"{at}: slot {slot}: {e!r} is not an expert id")
            if not 0 <= e < n:
                raise PlacementError(f"{at}: slot {slot}: expert {e} is out of range 0..{n - 1}")
            if e in seen:
                raise PlacementError(f"{at}: expert {e} appears twice (slots {seen[e]} and {slot})")
            seen[e] = slot
        if len(order) != n:
            missing = [e for e in range(n) if e not in seen]
            raise PlacementError(f"{at}: {len(order)} experts, expected {n}; missing expert(s) {_ranges(missing)}")
        out[layer] = tuple(order)
    return Placement(n, out, where)


def from_switch(value: str | None, config) -> Placement:
    """GLM_MOE_PLACEMENT's value (switches.read_switches().moe_placement): None = identity."""
    return identity(config) if value is None else load(value, config)


def dump(placement: Placement) -> str:
    """The file text of ``placement``."""
    body = {
        "format": FORMAT,
        "n_routed_experts": placement.n_experts,
        "layers": {str(k): list(v) for k, v in sorted(placement.layers.items())},
    }
    return json.dumps(body, indent=1) + "\n"


def _ranges(ids: list[int]) -> str:
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}..{ids[j]}")
        i = j + 1
    return ", ".join(parts) or "none"
