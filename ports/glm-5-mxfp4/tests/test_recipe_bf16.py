"""recipes/zai-org/GLM-5.3-BF16/recipe.yaml: the third serving page's launch block, rendered by
`fixpack recipe show`; `fixpack recipe check` on it; the page's "what not to do" as refusals
(glm5_hpu/serving_rules.py: the recipe rules and the checkpoint check)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from glm5_hpu import serving_rules as rules
from packtests.recipes import as_in_image, edited, rendered, seed_page, write_recipe

PORT = Path(__file__).resolve().parents[1]
REPO = PORT.parents[1]
RECIPE = REPO / "recipes" / "zai-org" / "GLM-5.3-BF16" / "recipe.yaml"

# The page's launch block, copied character for character (from "export CHECKPOINT_DIR" to the
# last serve flag).
SEED_BLOCK = """export CHECKPOINT_DIR=/models/GLM-5.3-MXFP4
export PT_HPU_LAZY_MODE=1
export VLLM_SKIP_WARMUP=true
export VLLM_BUCKETING_FROM_FILE=/opt/gaudi-cookbook/ports/glm-5-mxfp4/serving/tp8-seqs4-128k.txt
export VLLM_GRAPH_RESERVED_MEM=0.2
export VLLM_MOE_CHUNK=256
export VLLM_MOE_TOKEN_BOUNDARY=2048
export PT_HPU_QKV_SLICE_SEQ_LEN_THLD=128
export VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=3600
export VLLM_ENGINE_ITERATION_TIMEOUT_S=7200
export VLLM_HPU_FSDPA_SOFTMAX_MODE=None
export VLLM_LONG_PREFILL_SHARE=0.5
export VLLM_LONG_PREFILL_SHARE_ASYNC=1
export VLLM_LONG_PREFILL_MIN_TOKENS=32768
export GLM_DSA_SPARSE=1
export GLM_MXK=1
export GLM_MXK_PREFILL=1
export GLM_MOE_TP=2
export GLM_MOE_PLACEMENT=/opt/gaudi-cookbook/ports/glm-5-mxfp4/serving/glm53-ep4-placement.json
export GLM_ROUTER_FAST=1
export GLM_EARLY_DRAFT=1
export GLM_SPEC_DEVICE_REJECT=1

# Fixes: the v0.30.0 profile plus this recipe's opt-in fixes, in the pack's order.
# Stops with a non-zero exit code if the image does not match.
python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.30.0 \\
    vllm-long-prefill-share glm47-streaming-text-markers || exit 1

vllm serve $CHECKPOINT_DIR \\
  --served-model-name zai-org/GLM-5.3-BF16 \\
  --tensor-parallel-size 8 \\
  --enable-expert-parallel \\
  --dtype bfloat16 \\
  --max-model-len 131072 \\
  --max-num-seqs 4 \\
  --block-size 128 \\
  --max-num-batched-tokens 8192 \\
  --enable-chunked-prefill \\
  --long-prefill-token-threshold 4096 \\
  --gpu-memory-utilization 0.86 \\
  --max-cudagraph-capture-size 2048 \\
  --trust-remote-code \\
  --enable-prompt-tokens-details \\
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 1}' \\
  --reasoning-parser glm47 \\
  --tool-call-parser glm47 \\
  --enable-auto-tool-choice \\
  --default-chat-template-kwargs '{"reasoning_effort": "high", "clear_thinking": true}' \\
  --override-generation-config '{"temperature": 1.0, "top_p": 0.95}'
"""


def test_the_copied_block_is_the_pages_block():
    page = seed_page("003")
    if page is None:
        pytest.skip("the seeds folder is not beside this checkout")
    assert SEED_BLOCK in page.read_text()


def test_show_renders_the_pages_block():
    """Character for character, the fixes line included (its door, no --port, wrapped as the
    page wraps it: tests/integration/test_launch_lines.py runs it in an image the port's
    install.sh prepared). A repository path in an export is written "$COOKBOOK/..." (so `recipe
    check` can find the file), which is the page's /opt/gaudi-cookbook/... in the image."""
    block = rendered(RECIPE)
    assert as_in_image(block) == SEED_BLOCK
    assert '"$COOKBOOK/ports/glm-5-mxfp4/serving/tp8-seqs4-128k.txt"' in block and "--port" not in block


def _check(data: dict | None = None) -> dict[str, dict]:
    from fixpack.pack.pack import Pack
    from fixpack.pack.recipe import Recipe, check_recipe, load_recipe

    recipe = load_recipe(RECIPE)
    if data is not None:
        recipe = Recipe(RECIPE, data)
    return {r["item"]: r for r in check_recipe(recipe, Pack(REPO))}


def test_check_validates_every_fix_profile_switch_and_rule_and_names_the_missing_serving_files():
    records = _check()
    errors = {k for k, r in records.items() if r["result"] == "error"}
    # The placement file is not built (README: "Not built yet"); everything else holds.
    assert errors == {"path ports/glm-5-mxfp4/serving/glm53-ep4-placement.json"}
    assert records["path ports/glm-5-mxfp4/serving/tp8-seqs4-128k.txt"]["result"] == "ok"
    for item in [
        "profile v0.30.0",
        "port glm-5-mxfp4",
        "fix vllm-long-prefill-share",
        "fix glm47-streaming-text-markers",
        "rule expert-parallel",
        "rule fsdpa-softmax",
        "rule gpu-memory",
        "rule moe-tp",
        "rule bf16-source",
        "rule placement",
    ]:
        assert records[item]["result"] == "ok", records[item]
    switches = {k for k in records if k.startswith("switch ")}
    assert switches == {
        f"switch {n}"
        for n in [
            "GLM_DSA_SPARSE",
            "GLM_MXK",
            "GLM_MXK_PREFILL",
            "GLM_MOE_TP",
            "GLM_MOE_PLACEMENT",
            "GLM_ROUTER_FAST",
            "GLM_EARLY_DRAFT",
            "GLM_SPEC_DEVICE_REJECT",
        ]
    }
    assert all(records[s]["result"] == "ok" for s in switches)


def test_check_says_why_the_placement_file_is_missing(capsys):
    """Still an error (the launch names the file), with what it is, why it cannot be made here and
    the command that makes it (which its own parser accepts, writing the file the recipe names);
    the bucket file's note names the command that makes it."""
    from fixpack.cli.main import main
    from glm5_hpu import placement_fit

    rel = "ports/glm-5-mxfp4/serving/glm53-ep4-placement.json"
    detail = _check()[f"path {rel}"]["detail"]
    command = (
        f"python -m glm5_hpu.placement_fit $CHECKPOINT_DIR --prompts PROMPTS.jsonl --cards 8 --moe-tp 2 --out {rel}"
    )
    for words in [
        "which does not exist in",
        "the GLM_MOE_PLACEMENT file fitted to zai-org/GLM-5.3-BF16",
        "needs the real model's routing statistics",
        "cannot be produced in this repository",
        command,
        "the converted MXFP4 checkpoint",
        "leave GLM_MOE_PLACEMENT unset",
    ]:
        assert words in detail, detail
    args = placement_fit.parser().parse_args(command.split()[3:])
    assert (args.checkpoint, args.prompts, args.cards, args.moe_tp, args.out) == (
        "$CHECKPOINT_DIR",
        "PROMPTS.jsonl",
        8,
        2,
        rel,
    )
    assert main(["recipe", "check", "--recipe", str(RECIPE), "--pack", str(REPO)]) == 2
    assert "python -m glm5_hpu.placement_fit" in capsys.readouterr().err
    assert "python -m glm5_hpu.buckets --tree VLLM_GAUDI_TREE write" in rules.missing_file_note(
        "ports/glm-5-mxfp4/serving/tp8-seqs4-128k.txt"
    )
    assert rules.missing_file_note("ports/glm-5-mxfp4/serving/other.json") is None


def test_check_finds_an_opt_in_that_applies_on_its_release_only():
    """vllm-long-prefill-share applies on v0.30.0 only (fix.yaml releases:); the check finds it."""
    assert (REPO / "fixes" / "vllm-long-prefill-share" / "fix.yaml").is_file()
    assert _check()["fix vllm-long-prefill-share"]["detail"] == "opt-in of v0.30.0"


def _edited(change) -> dict:
    return edited(RECIPE, change)


def _drop_flag(flag):
    return lambda d: d["serve"].__setitem__(
        "args", [a for a in d["serve"]["args"] if a != flag and not (isinstance(a, dict) and flag in a)]
    )


def _set_flag(flag, value):
    return lambda d: d["serve"].__setitem__(
        "args", [{flag: value} if isinstance(a, dict) and flag in a else a for a in d["serve"]["args"]]
    )


@pytest.mark.parametrize(
    "change, rule, words",
    [
        (_drop_flag("--enable-expert-parallel"), "rule expert-parallel", "need --enable-expert-parallel"),
        (lambda d: d["env"].pop("VLLM_HPU_FSDPA_SOFTMAX_MODE"), "rule fsdpa-softmax", "needles fail from 32K"),
        (lambda d: d["env"].__setitem__("VLLM_HPU_FSDPA_SOFTMAX_MODE", "fast"), "rule fsdpa-softmax", "must be None"),
        (_set_flag("--gpu-memory-utilization", 0.9), "rule gpu-memory", "at most 0.86"),
        (_drop_flag("--gpu-memory-utilization"), "rule gpu-memory", "at most 0.86"),
        (lambda d: d.__setitem__("model", "zai-org/GLM-5.3-FP8"), "rule bf16-source", "never the FP8 release"),
        (lambda d: d.__setitem__("model", "zai-org/GLM-5.2"), "rule placement", "fitted to zai-org/GLM-5.3-BF16"),
        (
            lambda d: d["switches"].__setitem__("GLM_MOE_TP", "3"),
            "rule moe-tp",
            "does not divide --tensor-parallel-size 8",
        ),
        (lambda d: d["switches"].__setitem__("GLM_MXK", "true"), "switch GLM_MXK", "a recipe writes '1'"),
        (lambda d: d["switches"].__setitem__("GLM_MOE_TP", "0"), "switch GLM_MOE_TP", "below the minimum 1"),
        (
            lambda d: d["switches"].__setitem__("GLM_DSA_SPARS", "1"),
            "switch GLM_DSA_SPARS",
            "not a switch of port glm-5-mxfp4",
        ),
    ],
    ids=[
        "no-expert-parallel",
        "softmax-dropped",
        "softmax-fast",
        "memory-0.9",
        "memory-unset",
        "fp8-model",
        "placement-other-model",
        "moe-tp-3",
        "switch-spelling",
        "switch-range",
        "switch-unknown",
    ],
)
def test_check_refuses_what_the_page_says_not_to_do_and_bad_switches(change, rule, words):
    records = _check(_edited(change))
    assert records[rule]["result"] == "error" and words in records[rule]["detail"], records[rule]


def test_check_command_exits_2_naming_the_rule(capsys, tmp_path):
    from fixpack.cli.main import main

    recipe = write_recipe(tmp_path / "recipe.yaml", _edited(_drop_flag("--enable-expert-parallel")))
    assert main(["recipe", "check", "--recipe", str(recipe), "--pack", str(REPO)]) == 2
    assert "fused MXFP4 experts need --enable-expert-parallel" in capsys.readouterr().err


def test_serve_model_must_name_an_exported_variable(tmp_path, capsys):
    from fixpack.cli.main import main

    recipe = write_recipe(tmp_path / "recipe.yaml", _edited(lambda d: d["serve"].__setitem__("model", "$MISSING")))
    assert main(["recipe", "show", "--recipe", str(recipe), "--pack", str(REPO)]) == 2
    assert "serve.model '$MISSING'" in capsys.readouterr().err


def test_expert_parallel_load_time_check():
    rules.check_expert_parallel("mxfp4", True)
    rules.check_expert_parallel("fp8", False)  # not MXFP4 experts: not this rule's business
    with pytest.raises(rules.RuleError, match="need --enable-expert-parallel"):
        rules.check_expert_parallel("mxfp4", False)


# --------------------------------------------------------------------------- checkpoint
def _folder(path: Path, config: dict, index: bytes | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    if index is not None:
        (path / "model.safetensors.index.json").write_bytes(index)
    return path


SRC_INDEX = b'{"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}'
BASE = {"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"]}


def _converted(tmp_path: Path, name="dst", **over) -> Path:
    """A config.json with the quantization_config the converter itself writes."""
    from glm5_mxfp4.convert import quantization_config

    qc = quantization_config(
        {
            "scale_mode": "even",
            "block_size": 32,
            "source_index_sha256": hashlib.sha256(SRC_INDEX).hexdigest(),
            "converter": "glm5_mxfp4 0.1.0",
        }
    )
    qc.update(over)
    qc = {k: v for k, v in qc.items() if v is not None}
    return _folder(tmp_path / name, dict(BASE, quantization_config=qc))


def test_checkpoint_check_accepts_the_converters_output_and_its_source(tmp_path, capsys):
    dst = _converted(tmp_path)
    src = _folder(tmp_path / "bf16", dict(BASE), SRC_INDEX)
    assert rules.main(["checkpoint", str(dst)]) == 0
    assert rules.main(["checkpoint", str(dst), "--source", str(src)]) == 0
    assert "index matches the record" in capsys.readouterr().out


@pytest.mark.parametrize(
    "make, words",
    [
        (
            lambda t: _folder(
                t / "fp8",
                dict(BASE, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}),
            ),
            "an FP8 checkpoint",
        ),
        (lambda t: _folder(t / "bf16", dict(BASE)), "an unconverted checkpoint"),
        (lambda t: _converted(t, converter="another-tool 1.0"), "not written by glm5_mxfp4"),
        (lambda t: _converted(t, source_index_sha256=None), "no recorded source"),
        (lambda t: t / "absent", "config.json: missing"),
    ],
    ids=["fp8-release", "bf16-unconverted", "other-converter", "no-source-record", "no-config"],
)
def test_checkpoint_check_refuses(tmp_path, capsys, make, words):
    folder = make(tmp_path)
    assert rules.main(["checkpoint", str(folder)]) == 2
    err = capsys.readouterr().err
    assert words in err and str(folder) in err
    with pytest.raises(rules.RuleError, match=words):
        rules.check_checkpoint(str(folder))


def test_checkpoint_check_refuses_a_recorded_source_that_is_the_fp8_release_or_another(tmp_path, capsys):
    dst = _converted(tmp_path)
    # the record's index, but the folder is an FP8 build
    fp8 = _folder(tmp_path / "fp8", dict(BASE, quantization_config={"quant_method": "fp8"}), SRC_INDEX)
    assert rules.main(["checkpoint", str(dst), "--source", str(fp8)]) == 2
    assert "quantized build (the FP8 release?)" in capsys.readouterr().err
    other = _folder(tmp_path / "other", dict(BASE), SRC_INDEX + b" ")
    assert rules.main(["checkpoint", str(dst), "--source", str(other)]) == 2
    assert "converted from another source" in capsys.readouterr().err
