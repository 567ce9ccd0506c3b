"""GLM-5.3-Flash (ports/glm-5-3-flash) at its recipe's real shapes, one rank of TP 8 + EP, traced on
meta tensors. Needs vLLM 0.26.0 (``.venv-cpu``) and the port on the import path.

**What runs is the port's own model code**: vLLM's ``EngineArgs`` on the recipe's serve arguments
and the release's config (``glm5_next_hpu.release_config``, the real 45-layer shapes), then the
plugin's ``Glm5NextForConditionalGeneration`` built for rank 0 exactly as the port's memory plan
builds it (``memory_plan.build_rank_model``: the rank's TP/EP split, the switches of the case),
and its ``forward`` and ``compute_logits``: the embedding, every decoder layer with mHC (the
reference Sinkhorn loop or the kernel op, as the switch says), the router, the routed experts
(``ParallelExperts.forward_static``: every local expert on every token, dequantized per chunk;
or ``forward_fused``), the shared expert, the KDA layers' projections, gate and the HPU core
(``Glm5NextKDA._core_hpu``: vllm-gaudi's linear-attention contract, with ``chunk_kda`` (scan or
sequential carry) for prefill and ``fused_recurrent_kda`` for decode), norms, the LM head.

**What is stood in**, because it is vllm-gaudi's and needs its runtime:

* the step's metadata: ``get_forward_context`` returns a stand-in with vllm-gaudi's fields for
  the KDA core (``is_prompt``, ``load_indices_tensor``, ``padding_mask_flat``,
  ``has_initial_states_p``), and the platform reads as HPU at forward time (the port's HPU
  branch of the KDA layer; the model is built on the CPU platform, so its MLA layers are the
  expanded form);
* the MLA attention: vllm-gaudi's HPU MLA (``oot_mla.py``), written here with the same ops on
  the port's own projections: the fused q_a/kv_a GEMM, the norms, q_b; prefill expands the
  context's and the chunk's latents through kv_b_proj and runs FusedSDPA
  (``hpu::sdpa_recomp_fwd``) with the runner's attention bias when there is context; decode
  absorbs W_UK into the query, scores the latent cache, softmax, values from the latent, W_UV;
  then o_proj and its all-reduce. The DSA indexer is skipped (as the port does);
* the fused expert path: ``experts.moe_op`` is vllm-gaudi's ``VllmMixtureOfExpertsOpFP8PerChannel``
  call (dynamic per-token FP8 quantization of the activations, one
  ``hpu::mixture_of_experts.fp8_fused_weights`` over the rank's 36 experts held per channel in
  e4m3) on meta weights of the shapes it holds; the model's ``forward_fused`` calls it. The CPU
  build refuses ``GLM5_NEXT_MOE_OP=fused`` (no vLLM ``Fp8Config`` there), so the experts are
  built as the exact path's and the stand-in op set on them;
* the collectives: ``Parallel.reduce`` / ``gather`` record an all-reduce / all-gather over 8
  cards and return a tensor of the right shape;
* graph boundaries: where the port's ``hpu_mark_step`` says the runner marks (after every layer
  in prefill, every GLM5_NEXT_DECODE_LAYER_GROUP-th in decode), and at the step's end.

Weights the HPU path holds in block FP8 (MLA q_b / o_proj, dense MLPs, shared experts: the
memory plan's rule) are read at one byte a weight; the CPU build holds them in bf16.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import types
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .hardware import Calibration, Card
from .ops import AT_REST_ITEMSIZE
from .roofline import LAZY, REPLAY, StepTime, predict
from .trace import OpTrace

RANKS = 8
#: vllm-gaudi's HPU attention block (KV pages are 128 tokens)
BLOCK = 128


@dataclass(frozen=True)
class FlashSwitches:
    """The switches a case runs with (port.yaml ``switches``); ``moe_op`` is GLM5_NEXT_MOE_OP."""

    kda_scan: bool = True
    decode_layer_group: int = 45
    mhc_sinkhorn: str = "kernel"
    moe_op: str = "exact"

    def env(self) -> dict[str, str]:
        return {
            "GLM5_NEXT_KDA_SCAN": "1" if self.kda_scan else "0",
            "GLM5_NEXT_DECODE_LAYER_GROUP": str(self.decode_layer_group),
            "GLM5_NEXT_MHC_SINKHORN": self.mhc_sinkhorn,
            "GLM5_NEXT_MOE_OP": "exact",  # the CPU build refuses fused; its op is set after building
            "GLM5_NEXT_VISION": "0",  # text steps: the tower is not in the step
        }


#: the serving page's "switches on" (the recipe) and "off" (its reference path) columns
ON = FlashSwitches(kda_scan=True, decode_layer_group=45, mhc_sinkhorn="kernel")
OFF = FlashSwitches(kda_scan=False, decode_layer_group=1, mhc_sinkhorn="torch")


def switches_of_recipe(recipe: Path) -> FlashSwitches:
    """The switches the recipe launches with (unset ones at port.yaml's defaults)."""
    import yaml

    sw = {k: str(v) for k, v in (yaml.safe_load(recipe.read_text()).get("switches") or {}).items()}
    return FlashSwitches(
        kda_scan=sw.get("GLM5_NEXT_KDA_SCAN", "1") not in ("0", "false", "False"),
        decode_layer_group=int(sw.get("GLM5_NEXT_DECODE_LAYER_GROUP", "45")),
        mhc_sinkhorn=sw.get("GLM5_NEXT_MHC_SINKHORN", "kernel"),
        moe_op=expert_path(sw.get("GLM5_NEXT_MOE_OP", "auto")),
    )


def expert_path(value: str) -> str:
    """GLM5_NEXT_MOE_OP as the port resolves it on the card for the release's block-FP8 checkpoint
    (``glm5_next_hpu.vllm.fused_moe.resolve``): ``auto``, the port's default, is the fused op there."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from glm5_next_hpu.release_config import release_config
    from glm5_next_hpu.vllm.fused_moe import AUTO, FUSED, resolve

    qc = Fp8Config.from_config(release_config()["quantization_config"])
    chosen = resolve(value, SimpleNamespace(device_type="hpu"), qc)
    return FUSED if chosen == AUTO else chosen


def classify(layer_kinds: dict[str, str]):
    """Op class of a module name, for the time-by-class breakdown."""

    def op_class(module: str) -> str:
        if ".mlp.experts" in module:
            return "MoE routed experts"
        if ".mlp.gate" in module or ".mlp.shared_experts" in module:
            return "MoE router + shared expert"
        if ".mlp" in module:
            return "dense MLP"
        if ".self_attn" in module:
            layer = module.split(".self_attn")[0]
            return layer_kinds.get(layer, "attention")
        if "embed_tokens" in module or "lm_head" in module or module.endswith("language_model.norm"):
            return "embedding + LM head"
        if ".layers." in module:
            return "mHC + norms"
        return "other"

    return op_class


class _Platform:
    """The platform as the port's forward sees it on a card."""

    @staticmethod
    def is_cpu() -> bool:
        return False


@dataclass
class _Step:
    """vllm-gaudi's per-step metadata, as far as the port's HPU code reads it."""

    is_prompt: bool
    load_indices_tensor: torch.Tensor
    padding_mask_flat: torch.Tensor | None = None
    has_initial_states_p: torch.Tensor | None = None
    store_indices_tensor: torch.Tensor | None = None


class FlashModel:
    """The recipe's deployment, built per switch set on the meta device (rank 0 of TP 8 + EP)."""

    def __init__(self, recipe: Path):
        from glm5_next_hpu import memory_plan
        from glm5_next_hpu.release_config import write_release_config

        self.recipe = recipe
        kwargs, self.recipe_switches = memory_plan.recipe_args(recipe)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        from vllm.engine.arg_utils import EngineArgs

        import glm5_next_hpu

        glm5_next_hpu.register()
        folder = write_release_config(tempfile.mkdtemp(prefix="glm53flash-cost-"))
        with _env(self.recipe_switches):
            self.vllm_config = EngineArgs(
                model=str(folder), skip_tokenizer_init=True, enforce_eager=True, **kwargs
            ).create_engine_config()
        # vLLM counts the model as MLA only with the port patch mla-detect-glm5-next (the plan
        # applies its effect to the parsed config when this vLLM lacks it): the KV pool's page
        self.mla_detection = memory_plan._ensure_mla(self.vllm_config.model_config)
        self.serve = kwargs
        self.text = self.vllm_config.model_config.hf_text_config
        self._models: dict[FlashSwitches, torch.nn.Module] = {}

    # ---- the model per switch set
    def model(self, switches: FlashSwitches) -> torch.nn.Module:
        key = replace(switches, moe_op="exact")
        if key not in self._models:
            from glm5_next_hpu import memory_plan

            with _env(switches.env()):
                m = memory_plan.build_rank_model(self.vllm_config, 0)
            _hold_fp8_at_rest(m, self.vllm_config)
            self._models[key] = m
        return self._models[key]

    @property
    def layer_kinds(self) -> dict[str, str]:
        return {
            f"model.language_model.layers.{i}": ("KDA" if kind == "linear_attention" else "MLA attention")
            for i, kind in enumerate(self.text.layer_types)
        }

    # ---- traces
    def trace(self, switches: FlashSwitches, *, tokens: int, context: int, batch: int = 1) -> OpTrace:
        """One step: ``batch`` sequences of ``tokens`` new tokens each after ``context`` tokens
        (decode: tokens = 1). The trace ends with the step's logits and greedy sample."""
        model = self.model(switches)
        prompt = tokens > 1
        T = batch * tokens
        meta = dict(device="meta")
        trace = OpTrace(model)
        par = model.par
        reduce = functools.partial(_collective, trace, "all_reduce")
        gather = functools.partial(_collective, trace, "all_gather")
        step = _Step(
            is_prompt=prompt,
            load_indices_tensor=torch.zeros(batch, dtype=torch.int32, **meta),
            padding_mask_flat=torch.ones(T, dtype=torch.int32, **meta) if prompt else None,
            has_initial_states_p=torch.zeros(batch, dtype=torch.bool, **meta) if prompt else None,
        )
        ctx = types.SimpleNamespace(attn_metadata=step, no_compile_layers={})
        slots = self.vllm_config.scheduler_config.max_num_seqs * 4 + 2
        with _patched_forward(model, ctx, par, reduce, gather, switches, slots, step, context, tokens, batch, trace):
            ids = torch.zeros(batch, tokens, dtype=torch.int64, **meta)
            pos = torch.zeros(batch, tokens, dtype=torch.int64, **meta)
            with torch.no_grad(), trace:
                hidden = model(ids, pos)
                last = hidden.view(batch, tokens, -1)[:, -1] if prompt else hidden
                logits = model.compute_logits(last)
                torch.argmax(logits, dim=-1)
                trace.mark_step()
        return trace

    def trace_mhc_pair(self, switches: FlashSwitches, rows: int = 1) -> OpTrace:
        """One ``mhc_pre`` + ``mhc_post`` pair (the attention block's) of layer 0 at ``rows`` tokens,
        the port's ``mhc.hc_pre`` / ``hc_post`` with the layer's own parameters and switches."""
        from glm5_next_hpu import mhc as port_mhc

        layer = self.model(switches).model.language_model.layers[0]
        X = torch.empty(1, rows, self.text.hc_mult, self.text.hidden_size, dtype=torch.bfloat16, device="meta")
        y = torch.empty(1, rows, self.text.hidden_size, dtype=torch.bfloat16, device="meta")
        trace = OpTrace()
        with torch.no_grad(), trace:
            post, comb, _ = port_mhc.hc_pre(
                X, layer.hc_attn_fn, layer.hc_attn_base, layer.hc_attn_scale, **layer.hc_args
            )
            port_mhc.hc_post(y, X, post, comb)
        return trace

    def kda_ops_per_call(self, trace: OpTrace) -> int:
        """Aten ops one KDA layer's attention ran in ``trace`` (layer 0: its projections, gate, core)."""
        first = next(i for i, kind in enumerate(self.text.layer_types) if kind == "linear_attention")
        prefix = f"model.language_model.layers.{first}.self_attn"
        return sum(1 for r in trace.records if r.module == prefix or r.module.startswith(prefix + "."))

    def step_time(
        self,
        switches: FlashSwitches,
        *,
        tokens: int,
        context: int,
        card: Card,
        cal: Calibration,
        batch: int = 1,
        mode: str | None = None,
    ) -> StepTime:
        trace = self.trace(switches, tokens=tokens, context=context, batch=batch)
        capture = int(self.serve.get("max_cudagraph_capture_size") or 0) or 2048
        mode = mode or (REPLAY if batch * tokens <= capture else LAZY)
        st = predict(trace.records, mode, card, cal, classify(self.layer_kinds))
        st.workspace_peak = trace.peak_bytes
        return st


def _collective(trace: OpTrace, kind: str, x: torch.Tensor) -> torch.Tensor:
    trace.collective(kind, x, RANKS)
    if kind == "all_gather":
        return x.new_empty(*x.shape[:-1], x.shape[-1] * RANKS)
    return x


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _hold_fp8_at_rest(model: torch.nn.Module, vllm_config) -> None:
    """Mark the projections the HPU path builds as vLLM FP8 linear layers (the memory plan's
    rule: MLA q_b / kv_b / o_proj, dense MLPs, shared experts, unless modules_to_not_convert keeps
    them): their weights are read at one byte each."""
    from glm5_next_hpu.memory_plan import FP8_LINEAR
    from glm5_next_hpu.release_config import release_config

    skipped = set(release_config()["quantization_config"]["modules_to_not_convert"])
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and FP8_LINEAR.search(module) and module not in skipped:
            setattr(p, AT_REST_ITEMSIZE, 1)


def _fused_moe_op(experts, hidden: int, inter: int, total: int):
    """vllm-gaudi's VllmMixtureOfExpertsOpFP8PerChannel forward on the rank's experts (meta)."""
    e4m3 = torch.float8_e4m3fn
    w13 = [torch.empty(2 * inter, hidden, dtype=e4m3, device="meta") for _ in range(experts.count)]
    w2 = [torch.empty(hidden, inter, dtype=e4m3, device="meta") for _ in range(experts.count)]
    s13 = [torch.empty(2 * inter, dtype=torch.float32, device="meta") for _ in range(experts.count)]
    s2 = [torch.empty(hidden, dtype=torch.float32, device="meta") for _ in range(experts.count)]
    first = experts.start

    def moe_op(x, ids, weights, permuted_weights=True, activation="silu"):
        # vllm-gaudi's dynamic_quant: a per-token scale from the row's absolute maximum, then the cast
        scale = (x.abs().amax(dim=-1, keepdim=True).float() / 240.0).clamp(min=1e-12)
        x_fp8 = torch.ops.hpu.cast_to_fp8_v2(x, 1.0 / scale, False, False, e4m3)[0]
        return torch.ops.hpu.mixture_of_experts.fp8_fused_weights(
            hidden_states=x_fp8,
            expert_routing_table=ids,
            router_weights=weights,
            w12=w13,
            w3=w2,
            d_scale_hidden_states=scale,
            d_scale_w12=s13,
            d_scale_w3=s2,
            permuted_weights=permuted_weights,
            activation=activation,
            experts_min=first,
            experts_max=first + experts.count - 1,
            total_experts=total,
        )

    return moe_op


@contextlib.contextmanager
def _patched_forward(model, ctx, par, reduce, gather, switches, slots, step, context, tokens, batch, trace):
    """Everything stood in for one traced step (module docstring), undone afterwards."""
    from glm5_next_hpu.vllm import model as model_mod
    from hpu_emulation import ops as hpu_ops

    hpu_ops.register()
    saved_platform, saved_ctx = model_mod.current_platform, model_mod.get_forward_context
    model_mod.current_platform = _Platform()
    model_mod.get_forward_context = lambda: ctx
    changed: list[tuple[object, str, object]] = []

    def set_attr(obj, name, value):
        changed.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, value)

    hooks = []
    text = model.text_config
    new_par = replace(par, reduce=reduce, gather=gather)
    for module in model.modules():
        if getattr(module, "par", None) is not None and module.par is par:
            set_attr(module, "par", new_par)
    lm = model.model.language_model
    for layer in lm.layers:
        attn = layer.self_attn
        if layer.is_kda:
            conv_shape, rec_shape = attn.get_state_shape()
            conv_dtype, rec_dtype = attn.get_state_dtype()
            set_attr(
                attn,
                "kv_cache",
                (
                    torch.empty(slots, *conv_shape, dtype=conv_dtype, device="meta"),
                    torch.empty(slots, *rec_shape, dtype=rec_dtype, device="meta"),
                ),
            )
        else:
            set_attr(attn, "forward", types.MethodType(_hpu_mla(step, context, tokens, batch, trace, text), attn))
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            # the exact loop's card form: the model picks it off vLLM's CPU platform at build time,
            # and this model is built on the CPU platform (its gather form reads ids back to the host)
            set_attr(mlp.experts, "static", True)
        if switches.moe_op == "fused" and hasattr(mlp, "experts"):
            ex = mlp.experts
            set_attr(ex, "op", "fused")
            set_attr(
                ex, "moe_op", _fused_moe_op(ex, text.hidden_size, text.moe_intermediate_size, text.n_routed_experts)
            )

        def mark(module, _inputs, _output):
            if module.hpu_mark_step:
                trace.mark_step()

        hooks.append(layer.register_forward_hook(mark))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        for obj, name, old in reversed(changed):
            if old is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                setattr(obj, name, old)
        model_mod.current_platform, model_mod.get_forward_context = saved_platform, saved_ctx


_MISSING = object()


def _hpu_mla(step: _Step, context: int, tokens: int, batch: int, trace: OpTrace, text):
    """vllm-gaudi's HPU MLA forward (``oot_mla.py``), on the port's projections (module docstring)."""
    kv_lora = text.kv_lora_rank
    blocks_ctx = -(-context // BLOCK)
    keys_total = context + tokens

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        H, nope, vd = self.num_heads, self.nope, self.v_dim
        T = x.shape[0]
        cache = torch.empty(
            (blocks_ctx + -(-tokens // BLOCK) + 1) * BLOCK * batch, kv_lora, dtype=x.dtype, device="meta"
        )
        with trace.label("q_a+kv_a (fused GEMM)"):
            q_c = self.q_a_layernorm(self.q_a_proj(x))
            kv_c = self.kv_a_layernorm(self.kv_a_proj_with_mqa(x))
        q = self.q_b_proj(q_c).view(T, H, nope)
        with trace.label("latent cache write"):
            cache.index_copy_(0, torch.zeros(T, dtype=torch.int64, device="meta"), kv_c)
        if step.is_prompt:
            with trace.label("latent expand + FusedSDPA"):
                if context:
                    ctx_c = cache.index_select(
                        0, torch.zeros(batch * blocks_ctx * BLOCK, dtype=torch.int64, device="meta")
                    )
                    lat = torch.cat([ctx_c.view(batch, -1, kv_lora), kv_c.view(batch, tokens, kv_lora)], 1)
                else:
                    lat = kv_c.view(batch, tokens, kv_lora)
                S = lat.shape[1]
                kv = self.kv_b_proj(lat.reshape(-1, kv_lora)).view(batch, S, H, nope + vd)
                k, v = kv.split([nope, vd], dim=-1)
                qh = q.view(batch, tokens, H, nope).transpose(1, 2)
                bias = torch.zeros(batch, 1, tokens, S, dtype=x.dtype, device="meta") if context else None
                o = torch.ops.hpu.sdpa_recomp_fwd(
                    qh,
                    k.transpose(1, 2),
                    v.transpose(1, 2),
                    bias,
                    0.0,
                    nope**-0.5,
                    bias is None,
                    False,
                    "None",
                    None,
                    "right",
                )[0]
                o = o.transpose(1, 2).reshape(T, H * vd)
        else:
            with trace.label("latent attention (decode)"):
                w_uk_t = torch.empty(H, nope, kv_lora, dtype=x.dtype, device="meta")
                w_uv = torch.empty(H, kv_lora, vd, dtype=x.dtype, device="meta")
                q_lat = torch.bmm(q.transpose(0, 1), w_uk_t).transpose(0, 1)  # [T, H, kv_lora]
                keys = cache[: batch * keys_total].view(batch, keys_total, kv_lora)
                scores = torch.matmul(q_lat.view(batch, -1, kv_lora), keys.transpose(1, 2)).float()
                probs = torch.softmax(scores * nope**-0.5, dim=-1).to(x.dtype)
                o_lat = torch.matmul(probs, keys).view(T, H, kv_lora)
                o = torch.bmm(o_lat.transpose(0, 1), w_uv).transpose(0, 1).reshape(T, H * vd)
        return self.o_proj(o)

    return forward
