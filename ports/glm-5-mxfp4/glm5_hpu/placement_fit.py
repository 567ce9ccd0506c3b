"""python -m glm5_hpu.placement_fit: fit a GLM_MOE_PLACEMENT file to a model's routing.

One command, two steps:

1. **Routing statistics.** The converted checkpoint (a local folder the glm5_mxfp4 converter
   wrote: what is served) runs on CPU over a prompt set, layer by layer, and every MoE layer
   counts its (token, expert) assignments: the expert ids its router picks for each token, the
   MTP layer included. The forward is the port's own CPU reference: ``glm5_hpu.dsa`` attention
   (the DSA rule GLM_DSA_SPARSE selects, threshold 32,768 keys as served), the router and MXFP4
   experts of ``glm5_hpu.moe_mxfp4`` (the ids counted are the ones its forward routes with,
   through ``GlmMoeMxfp4.on_route``), the dense MLPs and norms as transformers 5.23.0 computes
   them. Each piece is proven against transformers' ``glm_moe_dsa`` in the port's tests, and
   ``tests/test_glm5_hpu_placement_fit.py`` shows the counts equal those of transformers'
   whole model (float32, dense attention, its router's top-k hooked) on the tiny checkpoint. Layer by layer
   means memory is one layer's weights (the experts packed, decoded per expert when a token
   reaches it) plus the prompts' hidden states, not the whole model.

   The MTP layer is run as vLLM's ``DeepSeekMTP`` runs it: at position p it takes the main
   model's final (normed) hidden state at p and the embedding of token p+1 (zero at position 0),
   ``eh_proj(cat(enorm(embedding), hnorm(hidden)))``, then its decoder layer, over positions
   0..T-2 of each sequence (teacher forcing: the tokens that follow are the file's own).

   For a causal model a token's routing in one forward over a text is its routing when that text
   is decoded token by token, so a prompt set of whole exchanges (prompts with their
   completions, as served) counts the decode routing; nothing is generated here.

2. **The fit.** Per layer, a permutation of the experts whose G consecutive equal slices (the
   expert groups, ``placement.Placement.group``) minimise the busiest group's load (the sum of
   its experts' counts; each of a group's GLM_MOE_TP cards does the same share of it, so the
   busiest card is the busiest group's). Method: largest count first into the least-loaded group
   with room, then exchanges of one expert between the busiest group and another while one
   lowers the busiest's load; the same exchanges from the checkpoint's order; the better of the
   two. Guarantees:

   * never worse than the checkpoint's order (it is one of the starts);
   * busiest <= total/G + (largest - smallest expert count): when no exchange helps, the
     busiest group A and the least-loaded B hold a > b with A - B <= a - b (else swapping them
     would lower A), and B <= total/G;
   * exact when the layer has at most EXACT_LIMIT groupings (E! / ((E/G)!^G G!)): a branch and
     bound search over all of them (the tiny model's 8 experts in 4 groups: 105);
   * optimal, and printed so, whenever the busiest group reaches the lower bound
     max(ceil(total/G), largest count), which no grouping can beat (on synthetic skewed counts
     of the real model's shape, 256 experts in 4 groups, it does: the tests).

   The permutation lists each group's experts in ascending id, groups ordered by their
   smallest id. The file is written in ``placement.py``'s format, checked by its own loader
   first, atomically (a temporary file in the same folder, then rename).

Prompt file (``--prompts``): JSON Lines, one sequence per line, either a list of token ids or a
string encoded with the checkpoint's tokenizer as it is (no chat template: write the templated
text, or the token ids the server logged). Blank lines are skipped.

``--counts-out`` writes the statistics (format ``glm5-moe-routing/1``) and ``--counts`` fits from
such a file instead of running the model: collect once, fit for several card layouts.

Nothing here runs on a card. On CPU the real 744B checkpoint needs a host that holds one layer
at a time (the recipe's 399 GiB over 79 layers: about 5 GiB, mostly packed experts), the
embedding, and the prompts' hidden states (12 KiB a token in bfloat16 at hidden size 6,144);
its run time on the real model is not measured.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import placement

COUNTS_FORMAT = "glm5-moe-routing/1"
EXACT_LIMIT = 20_000  # groupings searched exhaustively; beyond, the exchange heuristic alone
CONVERTER = "glm5_mxfp4"  # quantization_config["converter"] of the port's checkpoints
DTYPES = ("bfloat16", "float32")


class FitError(ValueError):
    """Input the fitter cannot use; the message names the file and the item."""


# ------------------------------------------------------------------------------------ the fit
def n_groupings(n_experts: int, n_groups: int) -> int:
    """How many ways ``n_experts`` split into ``n_groups`` unordered groups of equal size."""
    k = n_experts // n_groups
    return math.factorial(n_experts) // (math.factorial(k) ** n_groups * math.factorial(n_groups))


def group_loads(counts: Sequence[int], order: Sequence[int], n_groups: int) -> list[int]:
    """Each expert group's load when the experts are stored in ``order``."""
    k = len(order) // n_groups
    return [sum(counts[e] for e in order[g * k : (g + 1) * k]) for g in range(n_groups)]


def busiest(counts: Sequence[int], order: Sequence[int], n_groups: int) -> int:
    return max(group_loads(counts, order, n_groups))


def _check_split(n_experts: int, n_groups: int) -> None:
    if n_groups < 1 or n_experts % n_groups:
        raise FitError(f"{n_experts} experts do not split into {n_groups} equal expert groups")


def _greedy(counts: Sequence[int], n_groups: int) -> list[list[int]]:
    """Largest count first, each into the least-loaded group that still has room."""
    k = len(counts) // n_groups
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    loads = [0] * n_groups
    for e in sorted(range(len(counts)), key=lambda e: (-counts[e], e)):
        g = min((g for g in range(n_groups) if len(groups[g]) < k), key=lambda g: (loads[g], g))
        groups[g].append(e)
        loads[g] += counts[e]
    return groups


def _exchange(counts: Sequence[int], groups: list[list[int]]) -> list[list[int]]:
    """Swap one expert of the busiest group with one of another group while a swap lowers the
    busiest group's load, the best such swap first. Each swap replaces the loads A and B by two
    values below A, so the loads sorted in descending order decrease: it ends."""
    import numpy as np

    c = np.asarray(counts, dtype=np.int64)
    groups = [list(g) for g in groups]
    while True:
        loads = [int(c[g].sum()) for g in groups]
        a = max(range(len(groups)), key=lambda g: (loads[g], -g))
        best = None  # (new max of the two, group b, index in a, index in b)
        ca = c[groups[a]]
        for b in range(len(groups)):
            if b == a:
                continue
            d = ca[:, None] - c[groups[b]][None, :]  # load moved from a to b by each swap
            worst = np.maximum(loads[a] - d, loads[b] + d)
            worst = np.where(d > 0, worst, np.iinfo(np.int64).max)
            i, j = np.unravel_index(int(np.argmin(worst)), worst.shape)
            if worst[i, j] < loads[a] and (best is None or worst[i, j] < best[0]):
                best = (int(worst[i, j]), b, int(i), int(j))
        if best is None:
            return groups
        _, b, ia, ib = best
        groups[a][ia], groups[b][ib] = groups[b][ib], groups[a][ia]


def _exact(counts: Sequence[int], n_groups: int, start: list[list[int]]) -> list[list[int]]:
    """The grouping with the least busiest load: branch and bound over every grouping, starting
    from ``start``'s load (a grouping is kept only if strictly better). Largest counts placed
    first; an empty group is tried once per step (empty groups are interchangeable)."""
    k = len(counts) // n_groups
    items = sorted(range(len(counts)), key=lambda e: (-counts[e], e))
    best: list[Any] = [max(sum(counts[e] for e in g) for g in start), [list(g) for g in start]]  # [load, grouping]
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    loads = [0] * n_groups

    def place(i: int) -> None:
        if i == len(items):
            best[0], best[1] = max(loads), [list(g) for g in groups]
            return
        e = items[i]
        tried_empty = False
        for g in range(n_groups):
            if len(groups[g]) == k or loads[g] + counts[e] >= best[0]:
                continue
            if not groups[g]:
                if tried_empty:
                    continue
                tried_empty = True
            groups[g].append(e)
            loads[g] += counts[e]
            place(i + 1)
            loads[g] -= counts[e]
            groups[g].pop()

    place(0)
    return best[1]


@dataclass(frozen=True)
class Fit:
    order: list[int]  # the permutation: slot s stores expert order[s]
    before: int  # busiest group in the checkpoint's order
    after: int  # busiest group in ``order``
    total: int
    n_groups: int
    exact: bool  # searched every grouping

    largest: int = 0  # the largest expert count: a group holding that expert carries it
    smallest: int = 0

    @property
    def ideal(self) -> float:
        return self.total / self.n_groups

    @property
    def lower_bound(self) -> int:
        """No grouping's busiest group carries less: the ideal rounded up, or the largest count."""
        return max(-(-self.total // self.n_groups), self.largest)

    @property
    def optimal(self) -> bool:
        return self.exact or self.after == self.lower_bound

    def how(self) -> str:
        if self.exact:
            return f"optimal: searched all {n_groupings(len(self.order), self.n_groups)} groupings"
        if self.after == self.lower_bound:
            return "optimal: at the lower bound"
        return (
            f"exchange: {self.after - self.lower_bound} above the lower bound {self.lower_bound}, "
            f"bound {self.ideal + self.largest - self.smallest:.1f}"
        )


def fit(counts: Sequence[int], n_groups: int, exact_limit: int = EXACT_LIMIT) -> Fit:
    """The permutation of ``len(counts)`` experts into ``n_groups`` equal consecutive groups with
    the least busiest-group load this method finds (module docstring: method and guarantees)."""
    counts = [int(x) for x in counts]
    if any(x < 0 for x in counts):
        raise FitError("an expert count is negative")
    n = len(counts)
    _check_split(n, n_groups)
    k = n // n_groups
    identity = [list(range(g * k, (g + 1) * k)) for g in range(n_groups)]
    starts = [_exchange(counts, _greedy(counts, n_groups)), _exchange(counts, identity)]
    groups = min(starts, key=lambda gs: max(sum(counts[e] for e in g) for g in gs))  # the greedy start on a tie
    exact = n_groupings(n, n_groups) <= exact_limit
    if exact:
        groups = _exact(counts, n_groups, groups)
    order = [e for g in sorted((sorted(g) for g in groups), key=lambda g: g[0]) for e in g]
    return Fit(
        order,
        busiest(counts, range(n), n_groups),
        busiest(counts, order, n_groups),
        sum(counts),
        n_groups,
        exact,
        max(counts),
        min(counts),
    )


# ------------------------------------------------------------------------------ the checkpoint
class Checkpoint:
    """A glm5_mxfp4 checkpoint folder: its config and a reader of its tensors by name."""

    def __init__(self, folder: str | Path, dtype: str = "bfloat16"):
        import torch
        from transformers import GlmMoeDsaConfig

        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FitError(f"{self.folder}: not a checkpoint folder (no such folder)")
        cfg_path = self.folder / "config.json"
        data = _read_json(cfg_path, "the checkpoint's config")
        if not isinstance(data, dict) or data.get("model_type") != "glm_moe_dsa":
            got = data.get("model_type") if isinstance(data, dict) else None
            raise FitError(f"{cfg_path}: model_type {got!r}, expected 'glm_moe_dsa' (GLM-5.3)")
        converter = str((data.get("quantization_config") or {}).get("converter", ""))
        if not converter.startswith(CONVERTER):
            raise FitError(
                f"{cfg_path}: not a checkpoint the {CONVERTER} converter wrote (quantization_config."
                f"converter is {converter or 'absent'!r}); the fit counts the routing of the MXFP4 model "
                "that is served: convert the BF16 release first (python -m glm5_mxfp4.convert)"
            )
        self.config = GlmMoeDsaConfig.from_dict(data)
        mtp = getattr(self.config, "num_nextn_predict_layers", 0) or 0
        if mtp > 1:
            raise FitError(f"{cfg_path}: num_nextn_predict_layers is {mtp}; the fitter runs one MTP layer")
        self.mtp = mtp
        self.index_path = self.folder / "model.safetensors.index.json"
        if self.index_path.exists():
            index = _read_json(self.index_path, "the checkpoint's index")
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict):
                raise FitError(f"{self.index_path}: no weight_map")
        elif (self.folder / "model.safetensors").exists():
            self.index_path = self.folder / "model.safetensors"
            weight_map = {k: "model.safetensors" for k in _safetensors_keys(self.index_path)}
        else:
            raise FitError(f"{self.index_path}: cannot read the checkpoint's index: No such file or directory")
        for shard in sorted(set(weight_map.values())):
            if not (self.folder / shard).is_file():
                raise FitError(f"{self.folder / shard}: named by {self.index_path.name}, does not exist")
        self.weight_map: dict[str, str] = weight_map
        self.dtype = getattr(torch, dtype)
        self._open: dict[str, object] = {}

    def tensor(self, key: str):
        """Tensor ``key``: packed experts as stored (uint8), the router's correction bias as
        stored (float32 in the release), the indexer's weights_proj in float32 (as transformers
        keeps it), every other float tensor in the run's dtype."""
        import torch
        from safetensors import safe_open

        shard = self.weight_map.get(key)
        if shard is None:
            raise FitError(f"{self.index_path}: no tensor {key}")
        path = self.folder / shard
        try:
            if shard not in self._open:
                self._open[shard] = safe_open(str(path), "pt")
            t = self._open[shard].get_tensor(key)  # type: ignore[attr-defined]
        except Exception as exc:  # a damaged shard: safetensors raises its own types
            raise FitError(f"{path}: cannot read tensor {key}: {exc}") from None
        if not t.is_floating_point() or key.endswith("e_score_correction_bias"):
            return t
        return t.to(torch.float32 if key.endswith("indexer.weights_proj.weight") else self.dtype)

    def layer(self, layer: int) -> dict:
        """Layer ``layer``'s tensors without the layer prefix, other than its routed experts (read
        by GlmMoeMxfp4) and the MTP layer's shared_head (logits are not needed to count routing)."""
        prefix = f"model.layers.{layer}."
        return {
            k[len(prefix) :]: self.tensor(k)
            for k in sorted(self.weight_map)
            if k.startswith(prefix) and ".mlp.experts." not in k and not k.startswith(prefix + "shared_head.")
        }

    def tokenizer(self):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        except Exception as exc:  # transformers raises many kinds for a missing or broken tokenizer
            raise FitError(
                f"{self.folder}: text prompts need the checkpoint's tokenizer, which does not load "
                f"({type(exc).__name__}: {exc}); give token ids instead"
            ) from None


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise FitError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FitError(f"{path}: {what} is not JSON: {exc}") from None


def _safetensors_keys(path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return list(f.keys())
    except Exception as exc:
        raise FitError(f"{path}: cannot read: {exc}") from None


# ---------------------------------------------------------------------------------- prompts
def read_prompts(path: str | Path, ckpt: Checkpoint) -> list[list[int]]:
    """The prompt file's sequences as token ids (module docstring: the format)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise FitError(f"{path}: cannot read the prompt file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise FitError(f"{path}: the prompt file is not UTF-8 text: {exc}") from None
    cfg, tok, out = ckpt.config, None, []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{path}:{n}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FitError(f"{at}: not a JSON line (a list of token ids or a string): {exc}") from None
        if isinstance(item, str):
            tok = tok or ckpt.tokenizer()
            ids = list(tok.encode(item))
        elif isinstance(item, list):
            ids = item
            for i, t in enumerate(ids):
                if not isinstance(t, int) or isinstance(t, bool):
                    raise FitError(f"{at}: item {i}: {t!r} is not a token id")
        else:
            raise FitError(f"{at}: a line is a list of token ids or a string, not {type(item).__name__}")
        if not ids:
            raise FitError(f"{at}: an empty sequence")
        bad = [t for t in ids if not 0 <= t < cfg.vocab_size]
        if bad:
            raise FitError(f"{at}: token {bad[0]} is out of range 0..{cfg.vocab_size - 1}")
        if len(ids) > cfg.max_position_embeddings:
            raise FitError(f"{at}: {len(ids)} tokens, above max_position_embeddings {cfg.max_position_embeddings}")
        out.append(ids)
    if not out:
        raise FitError(f"{path}: no sequences in the prompt file")
    return out


# ----------------------------------------------------------------------------- the statistics
@dataclass
class Routing:
    """Per MoE layer, the (token, expert) assignments each expert got, and the tokens routed."""

    n_experts: int
    top_k: int
    counts: dict[int, list[int]]
    tokens: dict[int, int]
    source: str = ""


def collect(
    ckpt: Checkpoint,
    prompts: list[list[int]],
    *,
    sparse: bool,
    threshold: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Routing:
    """Run the checkpoint over ``prompts`` (token ids) layer by layer and count each MoE layer's
    routing (module docstring). ``sparse``: GLM_DSA_SPARSE; ``threshold``: the keys a query must
    see before the DSA top-k applies (default the recipe's 32,768)."""
    import torch
    import torch.nn.functional as F

    from .dsa import DENSE_UNTIL_KEYS, DsaAttention, DsaCache, rms_norm
    from .moe_mxfp4 import GlmMoeMxfp4

    cfg = ckpt.config
    n, eps = cfg.num_hidden_layers, cfg.rms_norm_eps
    view = copy.deepcopy(cfg)  # the MTP layer has its own indexer (vLLM's DeepSeekMTP builds one)
    assert cfg.indexer_types is not None, "a GLM-5.3 config names each layer's indexer"
    view.indexer_types = list(cfg.indexer_types) + ["full"] * ckpt.mtp
    moe = set(placement.moe_layers(cfg))
    e_count = cfg.n_routed_experts
    routing = Routing(e_count, cfg.num_experts_per_tok, {}, {})
    threshold = DENSE_UNTIL_KEYS if threshold is None else threshold

    def run_layer(layer: int, hs: list, sel: list) -> tuple[list, list]:
        start = time.monotonic()
        w = ckpt.layer(layer)
        attn = DsaAttention(
            view,
            {k[len("self_attn.") :]: v for k, v in w.items() if k.startswith("self_attn.")},
            layer,
            sparse=sparse,
            threshold=threshold,
        )
        mid, new_sel = [], []
        for h, s in zip(hs, sel, strict=True):  # attention one sequence at a time, its own cache
            o, allowed = attn.forward(
                rms_norm(h, w["input_layernorm.weight"], eps), torch.arange(h.shape[0]), DsaCache(), s
            )
            mid.append(h + o)
            new_sel.append(allowed)
        x = torch.cat(mid)  # the MLP is per token: every sequence's tokens at once
        m = rms_norm(x, w["post_attention_layernorm.weight"], eps)
        if layer in moe:
            counts = torch.zeros(e_count, dtype=torch.int64)

            def count(ids: torch.Tensor) -> None:
                counts.add_(torch.bincount(ids.flatten(), minlength=e_count))

            block = GlmMoeMxfp4.from_checkpoint(cfg, ckpt.tensor, layer)
            block.on_route = count
            y = block(m)
            routing.counts[layer] = counts.tolist()
            routing.tokens[layer] = x.shape[0]
        else:
            y = F.linear(
                F.silu(F.linear(m, w["mlp.gate_proj.weight"])) * F.linear(m, w["mlp.up_proj.weight"]),
                w["mlp.down_proj.weight"],
            )
        out = list((x + y).split([h.shape[0] for h in hs]))
        if progress:
            kind = "MTP" if layer >= n else "MoE" if layer in moe else "dense"
            progress(f"layer {layer} ({kind}): {x.shape[0]} tokens, {time.monotonic() - start:.1f} s")
        return out, new_sel

    with torch.no_grad():
        embed = ckpt.tensor("model.embed_tokens.weight")
        hs = [embed[torch.tensor(p)] for p in prompts]
        sel: list = [None] * len(prompts)
        for layer in range(n):
            hs, sel = run_layer(layer, hs, sel)
        if ckpt.mtp:
            norm = ckpt.tensor("model.norm.weight")
            w = {k: ckpt.tensor(f"model.layers.{n}.{k}") for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight")}
            xs = []
            for p, h in zip(prompts, hs, strict=True):
                if len(p) < 2:
                    continue  # no next token: no MTP position
                e = embed[torch.tensor(p[1:])].clone()
                e[0] = 0  # vLLM's DeepSeekMTP zeroes the embedding at position 0
                final = rms_norm(h[:-1], norm, eps)  # the main model's output: after its final norm
                xs.append(
                    F.linear(
                        torch.cat([rms_norm(e, w["enorm.weight"], eps), rms_norm(final, w["hnorm.weight"], eps)], -1),
                        w["eh_proj.weight"],
                    )
                )
            if xs:
                run_layer(n, xs, [None] * len(xs))
            else:
                routing.counts[n], routing.tokens[n] = [0] * e_count, 0
    return routing


def dump_routing(routing: Routing) -> str:
    body = {
        "format": COUNTS_FORMAT,
        "n_routed_experts": routing.n_experts,
        "top_k": routing.top_k,
        "source": routing.source,
        "layers": {str(k): {"tokens": routing.tokens[k], "counts": v} for k, v in sorted(routing.counts.items())},
    }
    return json.dumps(body) + "\n"


def load_routing(path: str | Path, config) -> Routing:
    """A ``--counts-out`` file, checked against ``config``: each MoE layer at most once, one
    non-negative count per expert, adding up to its tokens x top_k."""
    path = Path(path)
    data = _read_json(path, "the routing counts")
    if not isinstance(data, dict) or data.get("format") != COUNTS_FORMAT:
        got = data.get("format") if isinstance(data, dict) else None
        raise FitError(f"{path}: format is {got!r}, expected {COUNTS_FORMAT!r}")
    e, k = config.n_routed_experts, config.num_experts_per_tok
    if data.get("n_routed_experts") != e or data.get("top_k") != k:
        raise FitError(
            f"{path}: {data.get('n_routed_experts')!r} experts, top_k {data.get('top_k')!r}; the model "
            f"has {e} routed experts, top_k {k}"
        )
    layers = data.get("layers")
    if not isinstance(layers, dict) or not layers:
        raise FitError(f"{path}: 'layers' must map a MoE layer id to its tokens and counts")
    valid = placement.moe_layers(config)
    routing = Routing(e, k, {}, {}, str(data.get("source", "")))
    for key, entry in layers.items():
        at = f"{path}: layer {key}"
        if not (isinstance(key, str) and key.isdecimal() and int(key) in valid):
            raise FitError(f"{at}: not a MoE layer of this model (MoE layers: {placement._ranges(valid)})")
        counts = entry.get("counts") if isinstance(entry, dict) else None
        tokens = entry.get("tokens") if isinstance(entry, dict) else None
        if (
            not isinstance(counts, list)
            or len(counts) != e
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
        ):
            raise FitError(f"{at}: counts must be {e} non-negative integers")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or sum(counts) != tokens * k:
            raise FitError(f"{at}: the counts add up to {sum(counts)}, not tokens x top_k = {tokens!r} x {k}")
        routing.counts[int(key)], routing.tokens[int(key)] = counts, tokens
    return routing


# ------------------------------------------------------------------------------- the file
def placement_body(fits: dict[int, Fit], config, note: str) -> dict:
    return {
        "format": placement.FORMAT,
        "n_routed_experts": config.n_routed_experts,
        "note": note,
        "layers": {str(k): fits[k].order for k in sorted(fits)},
    }


def write_placement(path: str | Path, body: dict, config) -> placement.Placement:
    """Check ``body`` with placement.py's own rules, then write it atomically; the file written
    is read back with placement.load."""
    path = Path(path)
    head = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in body.items() if k != "layers"]
    rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in body["layers"].items()]  # a layer per line
    text = "{\n" + ",\n".join(head + [' "layers": {\n' + ",\n".join(rows) + "\n }"]) + "\n}\n"
    placement.check(json.loads(text), config, str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise FitError(f"{path}: cannot write the placement file: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return placement.load(path, config)


# ---------------------------------------------------------------------------------- command
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m glm5_hpu.placement_fit",
        description="fit a GLM_MOE_PLACEMENT file to the routing of a glm5_mxfp4 checkpoint on a prompt set",
    )
    p.add_argument("checkpoint", help="the converted checkpoint folder (local; nothing is downloaded)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompts", help="JSON Lines: per line a list of token ids or a string (the checkpoint's tokenizer)"
    )
    src.add_argument("--counts", help="fit from routing counts a previous run wrote with --counts-out")
    p.add_argument("--out", required=True, help="the placement file to write (glm5-moe-placement/1)")
    p.add_argument("--counts-out", help="also write the routing counts here")
    p.add_argument("--cards", type=int, default=8, help="cards in the node (default 8, the recipe's)")
    p.add_argument("--moe-tp", type=int, help="cards per expert group (default GLM_MOE_TP from the environment)")
    p.add_argument("--groups", type=int, help="the number of expert groups, instead of --cards / --moe-tp")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="activations (default bfloat16, as served)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _run(args)
    except (FitError, placement.PlacementError) as exc:
        print(f"placement_fit: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from .switches import SwitchError, read_switches

    try:
        switches = read_switches()
    except SwitchError as exc:
        raise FitError(str(exc)) from None
    ckpt = Checkpoint(args.checkpoint, args.dtype)
    cfg = ckpt.config
    if args.groups is not None:
        n_groups, layout = args.groups, "--groups"
    else:
        moe_tp = switches.moe_tp if args.moe_tp is None else args.moe_tp
        try:
            _, n_groups, _ = placement.expert_group(0, args.cards, moe_tp)
        except placement.PlacementError as exc:
            raise FitError(str(exc)) from None
        layout = f"{args.cards} cards, GLM_MOE_TP={moe_tp}"
    _check_split(cfg.n_routed_experts, n_groups)
    if args.prompts:
        prompts = read_prompts(args.prompts, ckpt)
        total = sum(len(x) for x in prompts)
        print(
            f"routing: {ckpt.folder}, {len(prompts)} sequences from {args.prompts} ({total} tokens), "
            f"{args.dtype}, GLM_DSA_SPARSE={int(switches.dsa_sparse)}",
            flush=True,
        )
        routing = collect(
            ckpt,
            prompts,
            sparse=switches.dsa_sparse,
            progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
        )
        routing.source = f"{args.prompts}: {len(prompts)} sequences, {total} tokens, {args.dtype}"
        if args.counts_out:
            try:
                Path(args.counts_out).write_text(dump_routing(routing))
            except OSError as exc:
                raise FitError(f"{args.counts_out}: cannot write the routing counts: {exc.strerror or exc}") from None
            print(f"wrote the routing counts to {args.counts_out}")
    else:
        routing = load_routing(args.counts, cfg)
        print(f"routing: {args.counts} ({routing.source or 'no source recorded'})")
    k = cfg.n_routed_experts // n_groups
    print(
        f"{n_groups} expert groups ({layout}) of {k} experts; busiest group's load per MoE layer, in (token, "
        f"expert) assignments: before = the checkpoint's order, ideal = the layer's total / {n_groups}, "
        "largest = the busiest single expert's (a group holding it carries at least that)"
    )
    print(f"{'layer':>7} {'tokens':>8} {'total':>9} {'largest':>8} {'before':>8} {'after':>8} {'ideal':>10}  fit")
    fits = {}
    for layer in sorted(routing.counts):
        f = fits[layer] = fit(routing.counts[layer], n_groups)
        name = f"{layer}{' MTP' if layer >= cfg.num_hidden_layers else ''}"
        print(
            f"{name:>7} {routing.tokens[layer]:>8} {f.total:>9} {f.largest:>8} {f.before:>8} {f.after:>8} {f.ideal:>10.1f}"
            f"  {f.how()}"
        )
    before, after = sum(f.before for f in fits.values()), sum(f.after for f in fits.values())
    ideal = sum(f.ideal for f in fits.values())
    print(
        f"{'all':>7} {'':>8} {sum(f.total for f in fits.values()):>9} {'':>8} {before:>8} {after:>8} {ideal:>10.1f}  "
        "(sums over the layers)"
    )
    note = (
        f"fitted by python -m glm5_hpu.placement_fit to {routing.source or args.counts} for {n_groups} "
        f"expert groups ({layout}); checkpoint {ckpt.folder.name}"
    )
    written = write_placement(args.out, placement_body(fits, cfg, note), cfg)
    print(
        f"wrote {args.out}: layers {placement._ranges(sorted(written.layers))} ({placement.FORMAT}, "
        "checked by glm5_hpu.placement.load)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
