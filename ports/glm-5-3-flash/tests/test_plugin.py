"""The vllm.general_plugins entry point: packaging, lazy registration, idempotence.

Needs an importable vLLM (run under .venv-cpu); the packaging test runs anywhere.
"""

import importlib.util
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest
import tomllib

PORT_DIR = Path(__file__).resolve().parents[1]
ENTRY = "glm5_next_hpu.vllm_plugin:register"
ARCH = "Glm5NextForConditionalGeneration"
TARGET = "glm5_next_hpu.vllm.model:Glm5NextForConditionalGeneration"

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not importable here (run under .venv-cpu)"
)


def test_pyproject_declares_the_general_plugin_entry_point():
    meta = tomllib.loads((PORT_DIR / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {"glm5_next_hpu": ENTRY}
    assert meta["tool"]["setuptools"]["packages"]["find"]["include"] == ["glm5_next_hpu", "glm5_next_hpu.*"]
    module, _, func = ENTRY.partition(":")
    assert callable(getattr(importlib.import_module(module), func))


def test_importing_the_plugin_module_imports_no_model_code():
    # register() runs in every vLLM process: it must not pull torch kernels or the model in.
    import subprocess

    code = (
        "import sys; import glm5_next_hpu.vllm_plugin as p; "
        "bad=[m for m in sys.modules if m.startswith(('glm5_next_hpu.vllm.', 'glm5_next_hpu.reference', 'glm5_next_hpu.layers', 'glm5_next_hpu.kda', 'torch'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PORT_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _installed_entry_points():
    return [
        ep
        for d in distributions()
        for ep in d.entry_points
        if ep.group == "vllm.general_plugins" and ep.value.startswith("glm5_next_hpu")
    ]


@needs_vllm
def test_load_general_plugins_registers_the_architecture_lazily_and_twice_is_fine(monkeypatch):
    if not _installed_entry_points():
        pytest.fail(
            "the glm5_next_hpu entry point is not installed in this interpreter: "
            "pip install --no-deps -e ports/glm-5-3-flash"
        )
    import vllm.plugins as plugins
    from vllm import ModelRegistry
    from vllm.model_executor.models.registry import _LazyRegisteredModel

    ModelRegistry.models.pop(ARCH, None)
    monkeypatch.setattr(plugins, "plugins_loaded", False)
    plugins.load_general_plugins()
    assert ARCH in ModelRegistry.get_supported_archs()
    entry = ModelRegistry.models[ARCH]
    assert isinstance(entry, _LazyRegisteredModel)  # string form: nothing imported yet
    assert f"{entry.module_name}:{entry.class_name}" == TARGET

    # A second load in the same process (vLLM guards it) and a direct second and third call.
    monkeypatch.setattr(plugins, "plugins_loaded", False)
    plugins.load_general_plugins()
    from glm5_next_hpu.vllm_plugin import register

    register()
    register()
    assert ModelRegistry.models[ARCH] is entry  # idempotent: same entry, not re-created
    from glm5_next_hpu import register as register_alias

    register_alias()  # port.yaml's target "glm5_next_hpu:register" resolves to the same function
    assert ModelRegistry.models[ARCH] is entry


@needs_vllm
def test_registered_class_is_hybrid_with_inner_state():
    """Without is_hybrid vLLM allocates no KDA state and every KDA layer is silently skipped."""
    from vllm import ModelRegistry

    from glm5_next_hpu.vllm_plugin import register

    register()
    assert ARCH in ModelRegistry.get_supported_archs()
    from vllm.model_executor.models.interfaces import has_inner_state, is_hybrid

    from glm5_next_hpu.vllm.model import Glm5NextForConditionalGeneration as C

    assert is_hybrid(C) and has_inner_state(C)
    assert C.is_hybrid is True


@needs_vllm
def test_registered_class_is_multimodal_with_the_port_processor():
    """Images: SupportsMultiModal, the port's processor registered with MULTIMODAL_REGISTRY, and
    vLLM's own embed_input_ids (the merge at placeholder positions) not overridden."""
    from vllm.model_executor.models.interfaces import SupportsMultiModal, supports_multimodal

    from glm5_next_hpu.vllm import multimodal as mm
    from glm5_next_hpu.vllm.model import Glm5NextForConditionalGeneration as C

    assert supports_multimodal(C)
    factories = C._processor_factory
    assert factories.info is mm.Glm5NextProcessingInfo
    assert factories.processor is mm.Glm5NextMultiModalProcessor
    assert factories.dummy_inputs is mm.Glm5NextDummyInputsBuilder
    assert C.embed_input_ids is SupportsMultiModal.embed_input_ids
    assert C.get_placeholder_str("image", 1) == "<|begin_of_image|><|image|><|end_of_image|>"
    with pytest.raises(ValueError, match="video input is not supported"):
        C.get_placeholder_str("video", 1)


@pytest.mark.parametrize("cap", [1, 16, 61, 2048, 8000])
def test_profiling_image_reaches_the_cap_exactly(cap):
    """The dummy image (rows x cols merged tokens of 28 px) is what the checkpoint's processor
    turns into exactly `cap` tokens, so vLLM profiles the largest image it will accept."""
    pytest.importorskip("vllm")
    from transformers.models.glm5_next.image_processing_glm5_next import Glm5NextImageProcessor

    from glm5_next_hpu.vllm.multimodal import near_square_grid

    rows, cols = near_square_grid(cap)
    assert rows * cols == cap and rows <= cols
    proc = Glm5NextImageProcessor()
    patches = proc.get_number_of_image_patches(rows * 28, cols * 28, {"max_image_tokens": cap})
    assert patches // 4 == cap


def _vision_config():
    from packtests import flash_reference as rh

    return rh.tiny_config().vision_config


@needs_vllm
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"patch_size": 7}, "patch_size=7: the vision tower takes patch_size 14"),
        ({"merge_size": 1}, "merge_size=1: the vision tower takes spatial_merge_size 2"),
        ({"temporal_patch_size": 1}, "temporal_patch_size=1"),
        ({"patch_expand_factor": 2}, "patch_expand_factor=2: only 1 is served"),
    ],
)
def test_processor_kwargs_that_change_the_patch_geometry_are_refused(kwargs, message):
    from glm5_next_hpu.vllm.multimodal import ImageInputError, check_geometry_kwargs

    vc = _vision_config()
    check_geometry_kwargs(
        {"patch_size": 14, "merge_size": 2, "max_image_tokens": 5}, vc
    )  # the config's own values pass
    with pytest.raises(ImageInputError, match=message):
        check_geometry_kwargs(kwargs, vc)


@needs_vllm
def test_processed_images_are_checked_against_the_tower_and_the_cap():
    import torch

    from glm5_next_hpu.vllm.multimodal import ImageInputError, check_processed_images

    vc = _vision_config()
    check_processed_images(torch.zeros(80, 1176), [[1, 8, 10]], vc, cap=20)  # 20 tokens at a cap of 20
    with pytest.raises(ImageInputError, match="image 1 would add 24 tokens, above the cap of 20"):
        check_processed_images(torch.zeros(176, 1176), [[1, 8, 10], [1, 12, 8]], vc, cap=20)
    with pytest.raises(ImageInputError, match="294 values, the vision tower takes 1176"):
        check_processed_images(torch.zeros(80, 294), [[1, 8, 10]], vc, cap=20)
    with pytest.raises(ImageInputError, match="9 x 10 patches does not divide"):
        check_processed_images(torch.zeros(90, 1176), [[1, 9, 10]], vc, cap=100)


# ----------------------------------------------------------------------------- switches


def test_switches_are_declared_once_in_port_yaml():
    yaml = pytest.importorskip("yaml")
    from dataclasses import fields

    from glm5_next_hpu import switches as sw

    declared = yaml.safe_load((PORT_DIR / "port.yaml").read_text())["switches"]
    spec = sw.load_spec(PORT_DIR / "port.yaml")
    assert list(spec) == list(declared)
    assert {sw.field_name(n) for n in spec} == {f.name for f in fields(sw.Switches)}
    # No other file of the package names a default: the parser's output is port.yaml's.
    s = sw.read_switches({}, spec)
    assert (s.vision, s.image_max_tokens, s.kda_scan, s.decode_layer_group, s.mhc_sinkhorn, s.moe_op) == (
        True,
        2048,
        None,
        45,
        "kernel",
        "auto",
    )
    # every switch names its reference path; for vision and the image cap it is the default
    assert {n: x.reference for n, x in spec.items()} == {
        "GLM5_NEXT_VISION": True,
        "GLM5_NEXT_IMAGE_MAX_TOKENS": 2048,
        "GLM5_NEXT_KDA_SCAN": False,
        "GLM5_NEXT_DECODE_LAYER_GROUP": 1,
        "GLM5_NEXT_MHC_SINKHORN": "torch",
        "GLM5_NEXT_MOE_OP": "exact",
    }
    assert sw.read_switches({"GLM5_NEXT_MOE_OP": "fused"}, spec).moe_op == "fused"
    assert sw.port_yaml() == PORT_DIR / "port.yaml"


def test_an_installed_plugin_finds_port_yaml_through_cookbook(tmp_path, monkeypatch):
    """Installed from a copy (install.sh), the package has no port.yaml beside it; in the image
    $COOKBOOK names the repository copy that holds it."""
    pytest.importorskip("yaml")
    import importlib.util
    import shutil

    pkg = tmp_path / "site" / "glm5_next_hpu"
    pkg.mkdir(parents=True)
    shutil.copy(PORT_DIR / "glm5_next_hpu" / "switches.py", pkg)
    spec = importlib.util.spec_from_file_location("_installed_switches", pkg / "switches.py")
    mod = sys.modules["_installed_switches"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv("COOKBOOK", raising=False)
    with pytest.raises(
        mod.SwitchError, match="port.yaml of port glm-5-3-flash, which declares its switches, was not found"
    ):
        mod.port_yaml()
    cookbook = tmp_path / "cookbook"
    (cookbook / "ports" / "glm-5-3-flash").mkdir(parents=True)
    shutil.copy(PORT_DIR / "port.yaml", cookbook / "ports" / "glm-5-3-flash")
    monkeypatch.setenv("COOKBOOK", str(cookbook))
    assert mod.port_yaml() == cookbook / "ports" / "glm-5-3-flash" / "port.yaml"
    assert mod.read_switches({"GLM5_NEXT_KDA_SCAN": "off"}).kda_scan is False


@pytest.mark.parametrize(
    "name, value",
    [
        ("GLM5_NEXT_VISION", "maybe"),
        ("GLM5_NEXT_IMAGE_MAX_TOKENS", "0"),
        ("GLM5_NEXT_DECODE_LAYER_GROUP", "46"),
        ("GLM5_NEXT_MHC_SINKHORN", "tpc"),
        ("GLM5_NEXT_KDA_SCAN", "2"),
        ("GLM5_NEXT_VISION", "auto"),
        ("GLM5_NEXT_MOE_OP", "fp8"),
    ],
)
def test_bad_switch_values_stop_with_the_variable_named(name, value):
    from glm5_next_hpu.switches import SwitchError, read_switches

    with pytest.raises(SwitchError, match=name):
        read_switches({name: value})


def _declared(**entry):
    return {"reference": entry.get("default"), "meaning": "m", **entry}


@pytest.mark.parametrize(
    "entry, message",
    [
        (_declared(default=1, type="float"), "type 'float' is not one of bool, int, enum, path, str"),
        ({"type": "bool", "reference": 1, "meaning": "m"}, "missing key 'default'"),
        (_declared(default=2, type="bool"), "default 2: '2' is not a boolean"),
        (_declared(default=1, type="int", min=2), "default 1: 1 is below the minimum 2"),
        (_declared(default="x", type="enum", choices=["a", "b"]), "default 'x': 'x' is not one of a, b"),
        (_declared(default="a", choices=["a", "b"]), "missing key 'type'"),
        (_declared(default=1, type="int", typo=1), "unknown key(s) typo"),
    ],
)
def test_a_bad_switch_declaration_names_the_file_and_the_switch(entry, message):
    from glm5_next_hpu.switches import SwitchError, parse_spec

    with pytest.raises(SwitchError) as info:
        parse_spec({"GLM5_NEXT_X": entry}, where="some/port.yaml", prefix="GLM5_NEXT_")
    assert str(info.value).startswith("some/port.yaml: switches.GLM5_NEXT_X: ") and message in str(info.value)


def test_recipe_values_go_through_the_same_parser():
    from glm5_next_hpu.switches import recipe_value_problem

    entry = {"default": "auto", "type": "bool", "reference": 0, "meaning": "m"}
    assert recipe_value_problem("GLM5_NEXT_KDA_SCAN", entry, "1") is None
    assert recipe_value_problem("GLM5_NEXT_KDA_SCAN", entry, "auto") is None
    # Accepted by the plugin, but a recipe (and the launch block it renders) writes 1/0.
    assert recipe_value_problem("GLM5_NEXT_KDA_SCAN", entry, "yes") == "'yes': a recipe writes '1'"
    assert "'2' is not a boolean" in recipe_value_problem("GLM5_NEXT_KDA_SCAN", entry, "2")
    n = {"default": 4, "type": "int", "max": 8, "reference": 4, "meaning": "m"}
    assert recipe_value_problem("GLM5_NEXT_N", n, "9") == "9 is above the maximum 8"


# ----------------------------------------------------------------------------- config.json


@pytest.fixture(scope="module")
def config_json(tmp_path_factory):
    from packtests.flash_reference import tiny_config

    cfg = tiny_config()
    d = tmp_path_factory.mktemp("cfg")
    cfg.save_pretrained(d)
    return cfg, d / "config.json"


def test_config_json_checked_field_by_field(config_json):
    import json

    from glm5_next_hpu.vllm.hf_config import TEXT_FIELDS, TOP_FIELDS, check_config_json

    cfg, path = config_json
    text, report = check_config_json(path)
    assert report["count"] == len(TEXT_FIELDS) + len(TOP_FIELDS) == 56
    assert report["extra"] == [], report["extra"]
    on_disk = json.loads(path.read_text())
    for name in TEXT_FIELDS:  # the vendored reading equals transformers' own reading, field by field
        assert getattr(text, name) == getattr(cfg.text_config, name), name
    for name in TOP_FIELDS:
        assert report["top"][name] == getattr(cfg, name), name
    # Fields save_pretrained leaves out (at their default) are reported as defaulted, not invented.
    absent = [n for n in TEXT_FIELDS if n not in on_disk["text_config"]]
    assert all(report["checked"][f"text_config.{n}"] == "default" for n in absent)


def test_config_json_of_the_real_default_config_passes_at_tp8(tmp_path):
    from transformers import Glm5NextConfig

    from glm5_next_hpu.vllm.hf_config import check_config_json

    Glm5NextConfig().save_pretrained(tmp_path)
    text, report = check_config_json(tmp_path, tp_size=8)
    assert (text.num_hidden_layers, text.layer_types.count("linear_attention"), text.qk_rope_head_dim) == (45, 34, 0)


@pytest.mark.parametrize(
    "mutate, error, message",
    [
        (lambda d: d["text_config"].update(num_hidden_layers="4"), "ConfigCheckError", "num_hidden_layers"),
        (
            lambda d: d["text_config"].update(layer_types=["linear_attention"] * 3),
            "ConfigCheckError",
            "layer_types: 3 entries",
        ),
        (lambda d: d["text_config"].update(scoring_func="softmax"), "ConfigCheckError", "scoring_func"),
        (lambda d: d["text_config"].update(rms_norm_eps=None), "ConfigCheckError", "rms_norm_eps"),
        (
            lambda d: d["text_config"].update(qk_rope_head_dim=64),
            "UnsupportedConfigError",
            "qk_rope_head_dim must be 0",
        ),
        (lambda d: d["text_config"].update(linear_lower_bound=None), "UnsupportedConfigError", "Kimi softplus"),
    ],
)
def test_config_json_mismatch_names_the_field(config_json, mutate, error, message):
    import json

    from glm5_next_hpu.vllm import hf_config

    d = json.loads(config_json[1].read_text())
    mutate(d)
    with pytest.raises(getattr(hf_config, error), match=message):
        hf_config.check_config_json(d)


def test_config_json_refuses_prefix_caching(config_json):
    from glm5_next_hpu.vllm.hf_config import UnsupportedConfigError, check_config_json

    with pytest.raises(UnsupportedConfigError, match="prefix caching is not supported"):
        check_config_json(config_json[1], prefix_caching=True)


# ----------------------------------------------------------------------------- loader


@pytest.fixture(scope="module")
def ckpt_and_model():
    from glm5_next_hpu.reference import Glm5NextReference
    from packtests.flash_reference import build_reference, checkpoint_tensors

    ref, cfg = build_reference()
    return checkpoint_tensors(ref), lambda: Glm5NextReference(cfg), cfg


def test_loader_maps_every_checkpoint_key_to_one_parameter_by_bytes(ckpt_and_model):
    import torch

    from glm5_next_hpu.vllm.loader import load_checkpoint

    ckpt, make, cfg = ckpt_and_model
    model = make()
    report = load_checkpoint(model, ckpt.items(), cfg.text_config.num_hidden_layers)
    assert report.loaded_keys == set(ckpt) and not report.skipped_keys
    assert report.loaded_params == {n for n, _ in model.named_parameters()}
    assert report.elements == sum(p.numel() for p in model.parameters()) == sum(t.numel() for t in ckpt.values())
    w13 = model.model.language_model.layers[1].mlp.experts.w13_weight
    assert torch.equal(
        w13[3, : w13.shape[1] // 2], ckpt["model.language_model.layers.1.mlp.experts.3.gate_proj.weight"]
    )


def test_loader_errors_name_the_exact_key(ckpt_and_model):
    import torch

    from glm5_next_hpu.vllm.loader import CheckpointLoadError, load_checkpoint

    ckpt, make, cfg = ckpt_and_model
    L = cfg.text_config.num_hidden_layers
    missing = "model.language_model.layers.1.mlp.experts.3.gate_proj.weight"
    with pytest.raises(CheckpointLoadError, match=re_escape(missing)):
        load_checkpoint(make(), ((k, v) for k, v in ckpt.items() if k != missing), L)
    with pytest.raises(CheckpointLoadError, match="model.language_model.layers.0.self_attn.bogus.weight: no parameter"):
        load_checkpoint(
            make(), [*ckpt.items(), ("model.language_model.layers.0.self_attn.bogus.weight", torch.zeros(1))], L
        )
    bad = dict(ckpt)
    bad["model.language_model.layers.2.self_attn.A_log"] = torch.zeros(1, 1, 4, 1)
    with pytest.raises(CheckpointLoadError, match=r"layers\.2\.self_attn\.A_log: checkpoint shape \(1, 1, 4, 1\)"):
        load_checkpoint(make(), bad.items(), L)
    key = "model.language_model.layers.0.hc_attn_fn"
    with pytest.raises(CheckpointLoadError, match=re_escape(key) + ": appears twice"):
        load_checkpoint(make(), [*ckpt.items(), (key, ckpt[key])], L)
    # Vision keys skipped on purpose (GLM5_NEXT_VISION=0) are reported, not silently dropped;
    # the vision parameters then count as not loaded unless the model did not build them.
    with pytest.raises(CheckpointLoadError, match="model.visual.patch_embed.proj.weight"):
        load_checkpoint(make(), ckpt.items(), L, skip=lambda k: k.startswith("model.visual."))


def test_flat_A_log_is_reshaped_before_sharding():
    """Seed 001: the flat [H] A_log fails at TP 8 and TP 1 hides it. The view rule reshapes first."""
    import torch

    from glm5_next_hpu.vllm.loader import CheckpointLoadError, load_checkpoint

    H, tp = 8, 4
    flat = torch.arange(H, dtype=torch.float32)

    def layer(view):
        m = torch.nn.Module()
        m.A_log = torch.nn.Parameter(torch.zeros(1, 1, H // tp, 1), requires_grad=False)
        m.A_log.glm5_shard_dim = 2
        if view:
            m.A_log.glm5_view = (1, 1, -1, 1)
        return m

    for rank in range(tp):
        m = layer(view=True)
        load_checkpoint(m, [("A_log", flat)], 1, tp_rank=rank, tp_size=tp)
        assert torch.equal(m.A_log.view(-1), flat[rank * 2 : rank * 2 + 2])
    with pytest.raises(CheckpointLoadError, match="A_log"):
        load_checkpoint(layer(view=False), [("A_log", flat)], 1, tp_rank=1, tp_size=tp)
    m = layer(view=True)
    m.A_log = torch.nn.Parameter(torch.zeros(1, 1, H, 1), requires_grad=False)
    m.A_log.glm5_shard_dim, m.A_log.glm5_view = 2, (1, 1, -1, 1)
    load_checkpoint(m, [("A_log", flat)], 1)  # TP 1
    assert torch.equal(m.A_log.view(-1), flat)


def re_escape(s: str) -> str:
    import re

    return re.escape(s)
