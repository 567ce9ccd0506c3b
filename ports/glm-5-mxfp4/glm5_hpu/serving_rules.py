"""The GLM-5.3 recipe's serving rules (its "what not to do"), enforced where code can.

Three places use this module (standard library only, so it loads without torch or vLLM):

* ``fixpack recipe check`` loads this file from the port folder and calls
  :func:`recipe_problems` on the recipe (fixpack/pack/recipe.py, ``port_rule_records``);
* the model, at load time, calls :func:`check_expert_parallel` and :func:`check_checkpoint`;
* a person, before serving, runs ``python -m glm5_hpu.serving_rules checkpoint DIR [--source SRC]``
  (exit 0 accepted, 2 refused, the message names the file and the item).

Rules:

1. fused MXFP4 experts need ``--enable-expert-parallel``: the stock loader does not split a
   fused MXFP4 expert across tensor-parallel ranks, and the load fails;
2. ``VLLM_HPU_FSDPA_SOFTMAX_MODE=None`` stays: with the fast softmax, needles fail from 32K;
3. ``--gpu-memory-utilization`` at most 0.86: the DSA indexer-key buffers come after profiling;
4. the checkpoint is the converter's MXFP4 made from the BF16 release, never from the FP8 one:
   the converter refuses FP8 sources and records its own name and the source index's sha256 in
   config.json's ``quantization_config``; a checkpoint without that record, an FP8 checkpoint,
   or (with ``--source``) a recorded source that is not the given BF16 folder is refused;
5. the placement file fitted to GLM-5.3 (``glm53-ep4-placement.json``) only with GLM-5.3;
6. (port.yaml) GLM_MOE_TP divides the tensor-parallel size.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

MODEL = "zai-org/GLM-5.3-BF16"
CONVERTER = "glm5_mxfp4"
MAX_MEMORY = 0.86
SOFTMAX_VAR = "VLLM_HPU_FSDPA_SOFTMAX_MODE"
SOFTMAX_VALUE = "None"
PLACEMENT_FILE = "glm53-ep4-placement.json"
FITTER = "glm5_hpu.placement_fit"  # the command that fits PLACEMENT_FILE to the model's routing
INDEX = "model.safetensors.index.json"
# quant_method values of FP8 builds (the FP8 release, compressed-tensors and other FP8 exports)
FP8_METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors", "modelopt", "ptpc_fp8", "fp_quant")


class RuleError(ValueError):
    """A serving configuration or checkpoint the recipe's serving rules forbid; the message names it."""


# --------------------------------------------------------------------------- expert parallel
def expert_parallel_problem(quant_method: str | None, enable_expert_parallel: bool) -> str | None:
    if quant_method == "mxfp4" and not enable_expert_parallel:
        return (
            "fused MXFP4 experts need --enable-expert-parallel: they are loaded by expert group and "
            "the stock loader does not split a fused MXFP4 expert across tensor-parallel ranks"
        )
    return None


def check_expert_parallel(quant_method: str | None, enable_expert_parallel: bool) -> None:
    """The model's load-time check; RuleError when MXFP4 experts would be split by TP."""
    problem = expert_parallel_problem(quant_method, enable_expert_parallel)
    if problem:
        raise RuleError(problem)


# --------------------------------------------------------------------------- checkpoint
def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _config(folder: str) -> tuple[str, dict]:
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise RuleError(f"{path}: missing (not a checkpoint folder)") from None
    except (OSError, ValueError) as exc:
        raise RuleError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise RuleError(f"{path}: not a JSON object")
    return path, config


def _source_problem(source: str, recorded: str) -> str | None:
    """Why ``source`` is not the BF16 folder the checkpoint records, or None."""
    spath, sconfig = _config(source)
    qc = sconfig.get("quantization_config")
    if qc is not None:
        method = qc.get("quant_method") if isinstance(qc, dict) else qc
        return (
            f"{spath}: the source has a quantization_config (quant_method {method!r}): it is a quantized "
            f"build (the FP8 release?), not {MODEL}"
        )
    index = os.path.join(source, INDEX)
    if not os.path.isfile(index):
        return f"{index}: missing; cannot compare the source with the checkpoint's record"
    got = _sha256(index)
    if got != recorded:
        return (
            f"{index}: sha256 {got} is not the source_index_sha256 {recorded} the checkpoint records: "
            "the checkpoint was converted from another source"
        )
    return None


def checkpoint_problems(folder: str, source: str | None = None) -> list[str]:
    """Every reason the checkpoint in ``folder`` is not one this port serves (empty: accepted)."""
    path, config = _config(folder)
    qc = config.get("quantization_config")
    if qc is None:
        return [
            f"{path}: no quantization_config: an unconverted checkpoint; convert {MODEL} with ports/glm-5-mxfp4/convert"
        ]
    if not isinstance(qc, dict):
        return [f"{path}: quantization_config is {type(qc).__name__}, not a mapping"]
    method = qc.get("quant_method")
    if method in FP8_METHODS or any(k in qc for k in ("weight_block_size", "activation_scheme")):
        return [
            f"{path}: quantization_config.quant_method {method!r}: an FP8 checkpoint; MXFP4 made from FP8 "
            f"has a larger error: convert {MODEL} (not the FP8 repository) with ports/glm-5-mxfp4/convert"
        ]
    if method != "mxfp4":
        return [f"{path}: quantization_config.quant_method {method!r}; this port serves mxfp4 experts"]
    problems = []
    converter = qc.get("converter")
    if not isinstance(converter, str) or converter.split(" ")[0] != CONVERTER:
        problems.append(
            f"{path}: quantization_config.converter {converter!r}: not written by {CONVERTER}, so its "
            "source is not recorded (the converter refuses FP8 sources); convert with ports/glm-5-mxfp4/convert"
        )
    recorded = qc.get("source_index_sha256")
    if not (isinstance(recorded, str) and len(recorded) == 64 and all(c in "0123456789abcdef" for c in recorded)):
        problems.append(f"{path}: quantization_config.source_index_sha256 {recorded!r}: no recorded source")
    elif source is not None:
        why = _source_problem(source, recorded)
        if why:
            problems.append(why)
    return problems


def check_checkpoint(folder: str, source: str | None = None) -> None:
    """The model's load-time check; RuleError naming the file and the item."""
    problems = checkpoint_problems(folder, source)
    if problems:
        raise RuleError("; ".join(problems))


# --------------------------------------------------------------------------- recipe
def _args(serve_args: list) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in serve_args:
        if isinstance(a, str):
            out[a] = None
        elif isinstance(a, dict) and len(a) == 1:
            ((flag, value),) = a.items()
            out[flag] = value
    return out


def recipe_problems(data: dict) -> list[tuple[str, str | None]]:
    """(rule, problem or None) for every rule a recipe can break; called by ``fixpack recipe check``."""
    env = {**(data.get("env") or {}), **(data.get("switches") or {})}
    args = _args((data.get("serve") or {}).get("args") or [])
    model = data.get("model")
    out: list[tuple[str, str | None]] = []

    # every checkpoint this port serves has MXFP4 experts (the converter's quant_method)
    out.append(("rule expert-parallel", expert_parallel_problem("mxfp4", "--enable-expert-parallel" in args)))

    value = env.get(SOFTMAX_VAR)
    out.append(
        (
            "rule fsdpa-softmax",
            None
            if value is not None and str(value) == SOFTMAX_VALUE
            else f"{SOFTMAX_VAR} is {value!r}: it must be {SOFTMAX_VALUE} (the accurate softmax); with the "
            "stock fast softmax, needles fail from 32K tokens",
        )
    )

    mem = args.get("--gpu-memory-utilization")
    try:
        ok = mem is not None and float(mem) <= MAX_MEMORY  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ok = False
    out.append(
        (
            "rule gpu-memory",
            None
            if ok
            else f"--gpu-memory-utilization is {mem!r}: at most {MAX_MEMORY}, the DSA indexer-key buffers are "
            "allocated after vLLM's memory profiling",
        )
    )

    tp, moe_tp = args.get("--tensor-parallel-size", 1), env.get("GLM_MOE_TP", 1)
    try:
        divides = int(tp) % int(moe_tp) == 0  # type: ignore[call-overload]
    except (TypeError, ValueError, ZeroDivisionError):
        divides = False
    out.append(
        (
            "rule moe-tp",
            None
            if divides
            else f"GLM_MOE_TP={moe_tp} does not divide --tensor-parallel-size {tp}: the cards of one expert group "
            "split each expert's intermediate dimension",
        )
    )

    fp8 = isinstance(model, str) and "fp8" in model.lower()
    out.append(
        (
            "rule bf16-source",
            f"model {model!r}: the port serves {MODEL} converted to MXFP4, never the FP8 release" if fp8 else None,
        )
    )

    placement = str(env.get("GLM_MOE_PLACEMENT") or "")
    wrong = os.path.basename(placement) == PLACEMENT_FILE and model != MODEL
    out.append(
        (
            "rule placement",
            f"GLM_MOE_PLACEMENT names {PLACEMENT_FILE}, fitted to {MODEL} routing, but the model is {model!r}"
            if wrong
            else None,
        )
    )
    return out


# --------------------------------------------------------------------------- serving files
BUCKET_FILE = "tp8-seqs4-128k.txt"


def missing_file_note(rel: str) -> str | None:
    """What a missing serving file the recipe names is and how it is made, or None; ``fixpack recipe
    check`` adds it to its error for that path (the check still fails: the launch needs the file)."""
    name = rel.rsplit("/", 1)[-1]
    if name == PLACEMENT_FILE:
        return (
            f"it is the GLM_MOE_PLACEMENT file fitted to {MODEL}: per MoE layer, the order its 256 experts "
            "are stored in, so the busiest experts spread over the 4 expert groups (format "
            "glm5-moe-placement/1, glm5_hpu/placement.py). Fitting it needs the real model's routing "
            "statistics (which experts each token picks, per MoE layer, over a serving workload), which "
            "only running the 744B checkpoint gives. The command that makes it: PYTHONPATH=ports/glm-5-mxfp4 "
            f"python -m {FITTER} $CHECKPOINT_DIR --prompts PROMPTS.jsonl --cards 8 --moe-tp 2 --out {rel} "
            "($CHECKPOINT_DIR: the converted MXFP4 checkpoint; PROMPTS.jsonl: a prompt set like the served "
            "traffic, per line a list of token ids or a string; it runs the model on CPU one layer at a "
            "time). Neither the checkpoint nor such a prompt set is here, so it cannot be produced in this "
            "repository. Until it exists, leave GLM_MOE_PLACEMENT unset to serve the checkpoint's order "
            "(slower, same output)"
        )
    if name == BUCKET_FILE:
        return (
            "it is the VLLM_BUCKETING_FROM_FILE bucket file; make it with PYTHONPATH=ports/glm-5-mxfp4 "
            f"python -m glm5_hpu.buckets --tree VLLM_GAUDI_TREE write {rel}"
        )
    return None


# --------------------------------------------------------------------------- command
def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m glm5_hpu.serving_rules", description="refuse a checkpoint the glm-5-mxfp4 port must not serve"
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("checkpoint", help="the converter's MXFP4 made from the BF16 release, or a refusal")
    c.add_argument("folder")
    c.add_argument("--source", help="the BF16 folder it was converted from: its index must match the record")
    args = p.parse_args(argv)
    try:
        problems = checkpoint_problems(args.folder, args.source)
    except RuleError as exc:
        problems = [str(exc)]
    if problems:
        for line in problems:
            print(f"refused: {line}", file=sys.stderr)
        return 2
    print(
        f"{args.folder}: MXFP4 checkpoint converted by {CONVERTER} from a BF16 source"
        + (" (the given source's index matches the record)" if args.source else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
