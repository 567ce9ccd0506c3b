"""What the planning command prints for a recipe: memory per card by purpose, predicted step times
with the op classes that dominate, the side-by-side table against the seed pages, and (Flash) the
serving page's floors checked on the recipe's expert path. Everything here is a PREDICTION.

A prompt's time to first token is the sum of its chunk steps (``--max-num-batched-tokens`` for
the Flash recipe, ``--long-prefill-token-threshold`` for GLM-5.3); a chunk's step is traced at a
few contexts and interpolated linearly in the context between them (the step is linear in the
context within a regime: the attention's FLOPs and bytes grow with the keys it reads).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import seeds
from .hardware import GAUDI2, Calibration, Card
from .roofline import StepTime

GIB = 2**30


@dataclass
class Outcome:
    row: seeds.Row
    predicted: float | None
    how: str  # what was predicted, or why the row cannot be

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.row.published


@dataclass
class StepLine:
    what: str
    step: StepTime
    per_second: float | None = None  # tokens/s the step gives (decode)


@dataclass
class Report:
    recipe: Path
    model: str
    card: Card
    cal: Calibration
    memory: list[tuple[str, int]] = field(default_factory=list)
    memory_notes: list[str] = field(default_factory=list)
    steps: list[StepLine] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    floors: list[tuple[str, float, str, bool]] = field(default_factory=list)  # (what, predicted, bound, ok)
    notes: list[str] = field(default_factory=list)

    @property
    def memory_total(self) -> int:
        return sum(b for name, b in self.memory if not name.startswith("  "))

    @property
    def fits(self) -> bool:
        return self.memory_total <= self.card.hbm_bytes

    @property
    def floors_met(self) -> bool:
        return all(ok for *_, ok in self.floors)

    def render(self) -> str:
        out = [
            f"PREDICTION for {self.model} ({self.recipe}) on {self.card.name}: a roofline model on the op trace, "
            "not a measurement.",
            "",
            f"## Memory per card by purpose (PREDICTION; card: {self.card.hbm_reported_mib.value:,.0f} MiB as the runtime reports it)",
            "",
            "| purpose | GiB |",
            "|---|---:|",
        ]
        out += [f"| {name} | {b / GIB:.2f} |" for name, b in self.memory]
        out.append(f"| total | {self.memory_total / GIB:.2f} |")
        out.append(
            f"| card | {self.card.hbm_bytes / GIB:.2f} |  ({'fits' if self.fits else 'DOES NOT FIT'}: "
            f"{(self.card.hbm_bytes - self.memory_total) / GIB:+.2f} GiB)"
        )
        out += [f"note: {n}" for n in self.memory_notes]
        out += [
            "",
            "## Predicted steps (PREDICTION)",
            "",
            "| step | predicted | device | host | kernels | host ops | graphs | dominant op classes (device ms) |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for line in self.steps:
            st = line.step
            rate = f" = {line.per_second:.1f} tok/s" if line.per_second else ""
            dom = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in st.dominant(4))
            out.append(
                f"| {line.what} | {st.total * 1e3:.1f} ms{rate} | {st.device * 1e3:.1f} ms | {st.host * 1e3:.1f} ms | "
                f"{st.kernels:,} | {st.host_ops:,} | {st.segments} | {dom} |"
            )
        out += ["", "## Side by side with the seed pages (PREDICTION vs the pages' measurements)", ""]
        out += ["| page | row | published | PREDICTION | ratio | |", "|---|---|---:|---:|---:|---|"]
        for o in self.outcomes:
            pred = "n/a" if o.predicted is None else f"{o.predicted:.3g} {o.row.unit}"
            ratio = "" if o.ratio is None else f"{o.ratio:.2f}"
            tag = "fitted on (calibration)" if o.row.fit else o.how
            out.append(f"| {o.row.page} | {o.row.what} | {o.row.published:g} {o.row.unit} | {pred} | {ratio} | {tag} |")
        predicted = [o for o in self.outcomes if o.predicted is not None and not o.row.fit]
        within = [o for o in predicted if 0.75 <= (o.ratio or 0) <= 1.25]
        out.append("")
        out.append(
            f"{len(within)} of {len(predicted)} predicted rows within 25 %; "
            f"{sum(o.row.fit for o in self.outcomes)} rows fitted; "
            f"{sum(o.predicted is None for o in self.outcomes)} not expressible."
        )
        if self.floors:
            out += ["", "## The serving page's floors on the recipe's expert path (PREDICTION)", ""]
            out += ["| gate | predicted | bound | verdict |", "|---|---:|---|---|"]
            for what, value, bound, ok in self.floors:
                out.append(f"| {what} | {value:.1f} | {bound} | {'meets' if ok else 'MISSES'} |")
        out += ["", "## Calibration constants (fitted on the rows marked above; the rest are predictions)", ""]
        out += ["| constant | value | fitted on |", "|---|---:|---|"]
        for name, c in self.cal.rows():
            out.append(f"| {name} | {c.value:.4g} {c.unit} | {c.fitted_on or 'assumption: ' + c.why} |")
        out += ["", "## Card figures", "", "| figure | value | source |", "|---|---:|---|"]
        out += [f"| {name} | {value:.4g} | {src} |" for name, value, src in self.card.sources()]
        out += [""] + [f"note: {n}" for n in self.notes]
        return "\n".join(out)


class Chunks:
    """A prompt's chunk steps, traced at a few contexts and interpolated between them."""

    def __init__(self, step_at, chunk: int, contexts: list[int]):
        self.chunk = chunk
        self.points = sorted(contexts)
        self.times = [step_at(c).total for c in self.points]

    def step(self, context: int) -> float:
        pts, ts = self.points, self.times
        if context <= pts[0]:
            return ts[0]
        j = min(bisect.bisect_left(pts, context), len(pts) - 1)
        i = j - 1
        if pts[j] == context or i < 0:
            return ts[j]
        return ts[i] + (ts[j] - ts[i]) * (context - pts[i]) / (pts[j] - pts[i])

    def ttft(self, prompt: int) -> float:
        return sum(self.step(c) for c in range(0, prompt, self.chunk))


# --------------------------------------------------------------------- GLM-5.3-Flash


def flash_report(recipe: Path, card: Card = GAUDI2, cal: Calibration | None = None) -> Report:
    from .flash import OFF, ON, FlashModel, switches_of_recipe

    cal = cal or Calibration()
    fm = FlashModel(recipe)
    rep = Report(recipe, seeds.FLASH, card, cal)
    chunk = int(fm.serve.get("max_num_batched_tokens") or 8192)
    max_len = int(fm.serve.get("max_model_len") or 131072)
    fused_on, fused_off = replace(ON, moe_op="fused"), replace(OFF, moe_op="fused")
    default = switches_of_recipe(recipe)
    cache: dict = {}

    def step(sw, tokens, context):
        key = (sw, tokens, context)
        if key not in cache:
            cache[key] = fm.step_time(sw, tokens=tokens, context=context, card=card, cal=cal)
        return cache[key]

    contexts = [0, 8192, 57344, 122880]
    ttft_on = Chunks(lambda c: step(fused_on, chunk, c), chunk, contexts)
    ttft_off = Chunks(lambda c: step(fused_off, chunk, c), chunk, contexts)
    K = 1024

    def tps(sw, ctx):
        return 1.0 / step(sw, 1, ctx).total

    page = {
        "flash.decode.2k.on": tps(fused_on, 2 * K),
        "flash.decode.128k.on": tps(fused_on, 128 * K),
        "flash.decode.2k.off": tps(fused_off, 2 * K),
        "flash.decode.128k.off": tps(fused_off, 128 * K),
        "flash.ttft.16k.on": ttft_on.ttft(16 * K),
        "flash.ttft.64k.on": ttft_on.ttft(64 * K),
        "flash.ttft.128k.on": ttft_on.ttft(128 * K),
        "flash.ttft.16k.off": ttft_off.ttft(16 * K),
        "flash.ttft.64k.off": ttft_off.ttft(64 * K),
        "flash.ttft.128k.off": ttft_off.ttft(128 * K),
        "flash.step.before": step(fused_off, 1, 2 * K).total * 1e3,
        "flash.step.after": step(fused_on, 1, 2 * K).total * 1e3,
        "flash.chunk.before": step(fused_off, chunk, 0).total * 1e3,
        "flash.chunk.after": step(fused_on, chunk, 0).total * 1e3,
    }
    ops_off = fm.kda_ops_per_call(fm.trace(fused_off, tokens=8192, context=0))
    ops_on = fm.kda_ops_per_call(fm.trace(fused_on, tokens=8192, context=0))
    page["flash.kda_ops.before"], page["flash.kda_ops.after"] = ops_off, ops_on
    page["flash.kda_host.before"] = ops_off * cal.host_op.value * 1e3
    page["flash.kda_host.after"] = ops_on * cal.host_op.value * 1e3
    from .roofline import REPLAY, predict

    zero = replace(cal, step_host=replace(cal.step_host, value=0.0), graph_launch=replace(cal.graph_launch, value=0.0))
    for key, sw in (("flash.sinkhorn.before", OFF), ("flash.sinkhorn.after", ON)):
        page[key] = predict(fm.trace_mhc_pair(sw).records, REPLAY, card, zero).device * 1e6
    how = {
        "decode": "1 / step, fused FP8 experts (the page's fast path), graph replay",
        "ttft": f"sum of {chunk}-token chunk steps, fused FP8 experts, lazy mode",
        "step": "predicted decode step",
        "chunk": "predicted lazy-mode chunk step",
        "kda_ops": "aten ops the port's KDA layer runs in the trace (a count, not calibrated)",
        "kda_host": "ops x host_op",
        "sinkhorn": "device time of the pair's kernels",
    }
    for row in seeds.rows(seeds.FLASH):
        rep.outcomes.append(Outcome(row, page[row.key], how[row.key.split(".")[1]]))

    # the steps, and the floors on the recipe's own expert path
    lines = [
        (f"decode 2K, switches on, {default.moe_op} experts (the recipe)", default, 1, 2 * K, True),
        (f"decode 128K, switches on, {default.moe_op} experts (the recipe)", default, 1, 128 * K, True),
        ("decode 2K, switches on, fused FP8 experts", fused_on, 1, 2 * K, True),
        ("decode 128K, switches on, fused FP8 experts", fused_on, 1, 128 * K, True),
        ("decode 2K, switches off, fused FP8 experts", fused_off, 1, 2 * K, True),
        (f"prefill 2,048-token prompt (one step), {default.moe_op} experts (the recipe)", default, 2048, 0, False),
        ("prefill 2,048-token prompt (one step), fused experts", fused_on, 2048, 0, False),
        (f"prefill chunk {chunk}, no context, {default.moe_op} experts (the recipe)", default, chunk, 0, False),
        (f"prefill chunk {chunk}, no context, fused experts", fused_on, chunk, 0, False),
        (f"prefill chunk {chunk} at 120K context, fused experts", fused_on, chunk, 122880, False),
    ]
    for what, sw, tokens, ctx, decode in lines:
        st = step(sw, tokens, ctx)
        rep.steps.append(StepLine(what, st, 1.0 / st.total if decode else None))
    recipe_ttft = Chunks(lambda c: step(default, chunk, c), chunk, contexts).ttft(128 * K)
    floors = seeds.FLASH_FLOORS
    d2, d128 = tps(default, 2 * K), tps(default, 128 * K)
    rep.floors = [
        (
            f"decode 2K tokens/s ({default.moe_op} experts)",
            d2,
            f">= {floors['decode_2k_min']:g}",
            d2 >= floors["decode_2k_min"],
        ),
        (
            f"decode 128K tokens/s ({default.moe_op} experts)",
            d128,
            f">= {floors['decode_128k_min']:g}",
            d128 >= floors["decode_128k_min"],
        ),
        (
            f"TTFT 128K s ({default.moe_op} experts)",
            recipe_ttft,
            f"<= {floors['ttft_128k_max']:g}",
            recipe_ttft <= floors["ttft_128k_max"],
        ),
    ]
    if default.moe_op != "fused":
        f2, f128 = tps(fused_on, 2 * K), tps(fused_on, 128 * K)
        f_ttft = ttft_on.ttft(128 * K)
        rep.floors += [
            (
                "decode 2K tokens/s (fused experts)",
                f2,
                f">= {floors['decode_2k_min']:g}",
                f2 >= floors["decode_2k_min"],
            ),
            (
                "decode 128K tokens/s (fused experts)",
                f128,
                f">= {floors['decode_128k_min']:g}",
                f128 >= floors["decode_128k_min"],
            ),
            (
                "TTFT 128K s (fused experts)",
                f_ttft,
                f"<= {floors['ttft_128k_max']:g}",
                f_ttft <= floors["ttft_128k_max"],
            ),
        ]
        rep.notes.append(
            "the floors are gated on the recipe's own expert path (GLM5_NEXT_MOE_OP unset = exact, the dense pass); "
            "the fused rows are what the page's fast path predicts"
        )
    _flash_memory(rep, fm, default, chunk, max_len, step)
    return rep


def _flash_memory(rep: Report, fm, default, chunk: int, max_len: int, step) -> None:
    from glm5_next_hpu import memory_plan
    from glm5_next_hpu.release_config import release_config

    model = fm.model(default)
    qc = release_config()["quantization_config"]
    weights = memory_plan.weight_bytes(model, list(qc["modules_to_not_convert"]), "fp8", 2)
    rep.memory.append(("weights", sum(weights.values())))
    rep.memory += [(f"  {k}", v) for k, v in weights.items() if v]
    kv, block, n, _, _ = memory_plan.kv_bytes(model, fm.vllm_config, fm.vllm_config.scheduler_config.max_num_seqs)
    rep.memory.append((f"KV pool ({block} x {n} blocks = {block * n:,} tokens)", sum(kv.values())))
    rep.memory += [(f"  {k}", v) for k, v in kv.items()]
    last = max_len - chunk
    peaks = {}
    for name, sw in (("the recipe's", default), ("fused", replace(default, moe_op="fused"))):
        peaks[name] = step(sw, chunk, last).workspace_peak
    worst = max(peaks.values())
    rep.memory.append((f"workspace peak: {chunk}-token chunk at {last:,} context (eager)", worst))
    rep.memory += [(f"  {k} experts", v) for k, v in peaks.items()]
    rep.memory_notes.append(
        "workspace: the peak of live tensors in the traced step, eager (nothing fused away), on top of weights and KV"
    )


# --------------------------------------------------------------------- GLM-5.3 (MXFP4)


def glm53_report(recipe: Path, card: Card = GAUDI2, cal: Calibration | None = None) -> Report:
    from glm5_hpu import memory_plan

    from .glm53 import Glm53Model, Glm53Switches, dsa_scoring_peak

    cal = cal or Calibration()
    gm = Glm53Model(recipe)
    rep = Report(recipe, seeds.GLM53, card, cal)
    cmd, nomxkp = Glm53Switches(), Glm53Switches(mxk_prefill=False)
    chunk = 4096  # --long-prefill-token-threshold: a long prompt's step
    cache: dict = {}

    def step(sw, tokens, context, batch=1):
        key = (sw, tokens, context, batch)
        if key not in cache:
            cache[key] = gm.step_time(sw, tokens=tokens, context=context, batch=batch, card=card, cal=cal)
        return cache[key]

    per_step = gm.decode_tokens_per_step()
    spec = 1 + gm.dep.mtp_layers

    def tps(sw, batch):
        return batch * per_step / step(sw, spec, 2048, batch).total

    def ttft(sw, prompt):
        if prompt <= 2048:
            return step(sw, prompt, 0).total
        return sum(step(sw, chunk, c).total for c in range(0, prompt, chunk))

    levers = (
        "not expressible: GLM_EARLY_DRAFT and GLM_SPEC_DEVICE_REJECT move host reads of the step (no op of the "
        "trace), and GLM_ROUTER_FAST=1 is vllm-gaudi's own routing in this port (its 0 is refused)"
    )
    how_decode = f"{per_step:.3f} tokens a step (MTP acceptance 0.816, page 003) / step, graph replay"
    values = {
        "glm53.decode1.cmd": (tps(cmd, 1), how_decode),
        "glm53.decode1.nomxkp": (tps(nomxkp, 1), how_decode + "; GLM_MXK_PREFILL does not act in decode"),
        "glm53.decode1.levers": (None, levers),
        "glm53.decode4.cmd": (tps(cmd, 4), how_decode + ", 4 sequences"),
        "glm53.decode4.nomxkp": (tps(nomxkp, 4), how_decode + ", 4 sequences"),
        "glm53.decode4.levers": (None, levers),
        "glm53.ttft2k.cmd": (ttft(cmd, 2048), "one 2,048-token step (graph replay); unpack + bf16 op"),
        "glm53.ttft2k.nomxkp": (
            ttft(nomxkp, 2048),
            "the stock MXFP4 op at MME bf16 rate (its internal dequantization is not published)",
        ),
        "glm53.ttft2k.levers": (ttft(nomxkp, 2048), "the levers act in decode only: as GLM_MXK_PREFILL=0"),
        "glm53.ttft8k.cmd": (ttft(cmd, 8192), f"{chunk}-token chunks (lazy mode); unpack + bf16 op"),
        "glm53.ttft8k.nomxkp": (ttft(nomxkp, 8192), f"{chunk}-token chunks; the stock MXFP4 op"),
        "glm53.ttft8k.levers": (ttft(nomxkp, 8192), "the levers act in decode only: as GLM_MXK_PREFILL=0"),
    }
    for row in seeds.rows(seeds.GLM53):
        value, how = values[row.key]
        rep.outcomes.append(Outcome(row, value, how))
    rep.notes.append(
        "GLM_MXK_PREFILL: the model predicts the unpack path slower than the stock op (it writes and re-reads every "
        "local expert in bf16 each call), the page measures it faster: the stock op's internal dequantization rate is "
        "not published, and the model counts the stock op at the MME's bf16 rate on the bytes it reads"
    )
    for what, sw, tokens, ctx, batch in (
        ("decode 1 stream at 2K (target 2 rows + MTP draft)", cmd, spec, 2048, 1),
        ("decode 4 streams at 2K", cmd, spec, 2048, 4),
        ("decode 1 stream at 128K", cmd, spec, 131072 - spec, 1),
        ("prefill 2,048 tokens", cmd, 2048, 0, 1),
        (f"prefill chunk {chunk} at 126,976 context", cmd, chunk, 131072 - chunk, 1),
    ):
        st = step(sw, tokens, ctx, batch)
        rep.steps.append(StepLine(what, st, batch * per_step / st.total if tokens == spec else None))
    # memory
    weights = memory_plan.card_weights(gm.cfg, gm.dep)
    rep.memory.append(("weights", sum(weights.values())))
    rep.memory += [(f"  {k}", v) for k, v in weights.items() if v]
    kv = memory_plan.kv_layout(gm.cfg, gm.dep)
    blocks = kv.blocks(memory_plan.SEED_KV_TOKENS)
    rep.memory.append(
        (f"KV pool (MLA latent, {memory_plan.SEED_KV_TOKENS:,} tokens: the page's pool)", kv.mla_bytes(blocks))
    )
    rep.memory.append(("DSA indexer-key buffers", kv.dsa_bytes(blocks, 2)))
    dsa = {(t, k): dsa_scoring_peak(t, k) for t, k in ((8192, 8192), (4096, 32768), (4096, 131072))}
    peak = step(cmd, chunk, 131072 - chunk).workspace_peak
    rep.memory.append((f"workspace peak: {chunk}-token chunk at 126,976 context (eager, DSA scoring included)", peak))
    for (t, k), b in dsa.items():
        rep.memory.append((f"  DSA prefill scoring alone: {t:,} queries x {k:,} keys", b))
    rep.memory_notes.append(
        "DSA scoring (hpu_dsa.prefill_bias): each query against every visible key in fp32, masked, argsorted, in "
        "query chunks of at most hpu_dsa.SCORE_BUDGET bytes; the peak is of the eager op sequence (the new bf16 "
        "bias of queries x keys, one chunk's per-head scores, masked copy and int64 sort indices)"
    )
    return rep


def report(recipe: Path, card: Card = GAUDI2, cal: Calibration | None = None) -> Report:
    import yaml

    port = (yaml.safe_load(recipe.read_text()) or {}).get("port")
    if port == "glm-5-3-flash":
        return flash_report(recipe, card, cal)
    if port == "glm-5-mxfp4":
        return glm53_report(recipe, card, cal)
    raise ValueError(f"{recipe}: port {port!r}; the cost model knows glm-5-3-flash and glm-5-mxfp4")
