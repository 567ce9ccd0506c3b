"""Checkpoint keys -> port parameters.

The checkpoint layout (what transformers' ``save_pretrained`` writes for glm5_next, and
what vLLM 0.33 reads) differs from transformers' in-memory modules; the port names its
modules after the checkpoint, so most keys load as they are. The exceptions:

* ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (one tensor per expert) are stacked into
  ``mlp.experts.w13_weight`` [E, 2I, D] (gate rows first, then up) and
  ``mlp.experts.w2_weight`` [E, D, I], the layout of vLLM's FusedMoE.
* ``self_attn.A_log`` is flat [H] on disk. The port keeps it flat; a TP-sharded loader
  must reshape before sharding (vLLM's Kimi layer holds [1, 1, H, 1]).
* MTP layers (index >= num_hidden_layers) and ``shared_head`` are skipped, as transformers does.

:func:`map_checkpoint_key` is the part the vLLM weight loader reuses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from .reference import Glm5NextReference

# A block-FP8 expert's scale (``.weight_scale_inv``) stacks like its weight, into ``w13_weight_scale_inv`` etc.
_EXPERT = re.compile(
    r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)"
    r"\.weight(?P<scale>_scale_inv)?$"
)
_LAYER = re.compile(r"\.layers\.(\d+)\.")


class Target(NamedTuple):
    param: str  # port parameter name
    expert: int | None = None  # expert index for stacked MoE weights
    shard: str | None = None  # "gate" | "up" | "down"


def map_checkpoint_key(key: str, num_hidden_layers: int) -> Target | None:
    """Port target for a checkpoint key, or None when the key is deliberately skipped."""
    m = _LAYER.search(key)
    if m and (int(m.group(1)) >= num_hidden_layers or ".shared_head." in key):
        return None  # MTP head
    m = _EXPERT.match(key)
    if m:
        proj = m.group("proj")
        param = m.group("prefix") + (".w2_weight" if proj == "down_proj" else ".w13_weight") + (m.group("scale") or "")
        return Target(param, int(m.group("expert")), proj.removesuffix("_proj"))
    return Target(key)


@torch.no_grad()
def load_weights(
    model: Glm5NextReference, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
) -> set[str]:
    """Copy (checkpoint key, tensor) pairs into ``model``. Returns the loaded checkpoint keys.

    With ``strict``, an unknown key, a shape mismatch or a parameter left unloaded raises
    (checked on bytes written, not on a loader's return value).
    """
    params = dict(model.named_parameters())
    num_layers = model.config.text_config.num_hidden_layers
    loaded_keys: set[str] = set()
    touched: dict[str, int] = {}
    for key, tensor in weights:
        target = map_checkpoint_key(key, num_layers)
        if target is None:
            continue
        if target.param not in params:
            if strict:
                raise KeyError(f"checkpoint key {key!r} has no port parameter ({target.param!r})")
            continue
        dest: torch.Tensor = params[target.param]
        if target.expert is not None:
            dest = dest[target.expert]
            half = dest.shape[0] // 2
            if target.shard == "gate":
                dest = dest[:half]
            elif target.shard == "up":
                dest = dest[half:]
        if dest.shape != tensor.shape:
            raise ValueError(f"{key}: checkpoint shape {tuple(tensor.shape)} != port shape {tuple(dest.shape)}")
        dest.copy_(tensor)
        loaded_keys.add(key)
        touched[target.param] = touched.get(target.param, 0) + tensor.numel()
    if strict:
        incomplete = sorted(n for n, p in params.items() if touched.get(n, 0) != p.numel())
        if incomplete:
            raise ValueError(f"{len(incomplete)} port parameters not fully loaded, e.g. {incomplete[:5]}")
    return loaded_keys
