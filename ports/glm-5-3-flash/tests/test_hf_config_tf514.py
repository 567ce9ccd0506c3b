"""Config parse under the stock vllm-gaudi v0.26.0 image's transformers (5.14.1, no glm5_next).

Runs only in an environment with exactly transformers 5.14.1: ``.venv-tf514``
(``scripts/setup-tf514.sh``: CPU torch, vLLM 0.26.0's requirements, transformers 5.14.1, the
plugin installed editable so its ``vllm.general_plugins`` entry point is real). vLLM itself is
the v0.26.0 release tree (``fixpack sources tree``; ``FIXPACK_TREE`` to reuse one). Each case runs
in a fresh interpreter, because plugins and AutoConfig registrations are process-global:

    .venv-tf514/bin/python -m pytest -p no:cacheprovider ports/glm-5-3-flash/tests/test_hf_config_tf514.py

Config: the release's config.json as the port reads it (``glm5_next_hpu.release_config``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PORT_DIR = Path(__file__).resolve().parents[1]
REPO = PORT_DIR.parents[1]

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    transformers.__version__ != "5.14.1",
    reason=f"needs exactly transformers 5.14.1 (the stock image's), found {transformers.__version__}: "
    "run in .venv-tf514 (scripts/setup-tf514.sh)",
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    if os.environ.get("FIXPACK_TREE"):
        return Path(os.environ["FIXPACK_TREE"])
    fixpack_py = REPO / ".venv" / "bin" / "python"  # fixpack's own environment (scripts/setup.sh)
    if not fixpack_py.exists():
        pytest.skip(
            "no .venv with fixpack to build the v0.26.0 release tree (run scripts/setup.sh), or set FIXPACK_TREE"
        )
    dest = tmp_path_factory.mktemp("release") / "site-packages"
    proc = subprocess.run(
        [str(fixpack_py), "-m", "fixpack", "sources", "tree", str(dest), "--profile", "v0.26.0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    if proc.returncode != 0:
        pytest.skip(
            f"release sources unavailable (`fixpack sources tree` exited {proc.returncode}): {proc.stderr[-300:]}"
        )
    return dest


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from glm5_next_hpu.release_config import write_release_config

    return write_release_config(tmp_path_factory.mktemp("glm53flash"))


def run(tree: Path, code: str, plugins: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{PORT_DIR}", VLLM_LOGGING_LEVEL="ERROR")
    if not plugins:
        env["VLLM_PLUGINS"] = ""  # an allow-list naming no plugin: vLLM loads none
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=600
    )


def test_without_the_plugin_this_transformers_cannot_parse_the_config(tree, checkpoint):
    # The negative control: the environment really is the stock image's (no glm5_next anywhere).
    proc = run(
        tree,
        f"""
        import sys
        from vllm.transformers_utils.config import get_config
        for remote in (False, True):
            try:
                get_config({str(checkpoint)!r}, trust_remote_code=remote)
            except Exception as exc:
                print(type(exc).__name__, str(exc)[:200].replace(chr(10), ' '))
            else:
                sys.exit('parsed without the plugin')
    """,
        plugins=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count("glm5_next") == 2, proc.stdout


def test_the_plugin_registers_the_configs_and_vllm_parses_the_release_config(tree, checkpoint):
    proc = run(
        tree,
        f"""
        import json
        import transformers
        import vllm.plugins
        from importlib.metadata import entry_points
        eps = [ep.value for ep in entry_points(group="vllm.general_plugins") if ep.name == "glm5_next_hpu"]
        assert eps == ["glm5_next_hpu.vllm_plugin:register"], eps  # the installed entry point, as vLLM loads it
        from vllm.transformers_utils.config import get_config
        from vllm.engine.arg_utils import EngineArgs
        # EngineArgs loads the general plugins in __post_init__, before it parses config.json.
        args = EngineArgs(model={str(checkpoint)!r}, tensor_parallel_size=8, enable_expert_parallel=True,
                          max_model_len=262144, max_num_seqs=32, dtype="bfloat16", skip_tokenizer_init=True,
                          enable_prefix_caching=False)
        mc = args.create_model_config()
        hf = get_config({str(checkpoint)!r}, trust_remote_code=False)
        t = mc.hf_text_config
        print(json.dumps(dict(
            transformers=transformers.__version__, cls=type(hf).__name__, module=type(hf).__module__,
            text_cls=type(t).__name__, text_type=t.model_type, vision_type=hf.vision_config.model_type,
            arch=mc.architecture, hybrid=mc.is_hybrid, max_len=mc.max_model_len,
            layer_types=t.layer_types, mlp_layer_types=t.mlp_layer_types, indexer_types=t.indexer_types,
            text={{k: getattr(t, k) for k in ("hidden_size", "num_hidden_layers", "n_routed_experts", "num_local_experts",
                  "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "head_dim", "qk_head_dim", "linear_num_heads",
                  "linear_head_dim", "num_key_value_heads", "swiglu_limit", "hc_mult")}},
            vision_out=hf.vision_config.out_hidden_size, vision_heads=hf.vision_config.num_attention_heads,
            quant=mc.quantization,
        )))
    """,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["transformers"] == "5.14.1"
    assert (got["cls"], got["module"]) == ("Glm5NextConfig", "glm5_next_hpu.hf_configs")
    assert (got["text_cls"], got["text_type"], got["vision_type"]) == (
        "Glm5NextTextConfig",
        "glm5_next_text",
        "glm5_next_vision",
    )
    assert got["arch"] == "Glm5NextForConditionalGeneration" and got["hybrid"] is True and got["max_len"] == 262144
    assert got["quant"] == "fp8"
    assert got["layer_types"].count("linear_attention") == 34 and got["layer_types"].count("indexed_attention") == 11
    assert got["mlp_layer_types"][:4] == ["dense", "dense", "dense", "sparse"] and got["indexer_types"] == ["full"] * 45
    assert got["text"] == {
        "hidden_size": 4096,
        "num_hidden_layers": 45,
        "n_routed_experts": 288,
        "num_local_experts": 288,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 0,
        "qk_nope_head_dim": 256,
        "head_dim": 0,
        "qk_head_dim": 256,
        "linear_num_heads": 64,
        "linear_head_dim": 128,
        "num_key_value_heads": 64,
        "swiglu_limit": 10.0,
        "hc_mult": 4,
    }
    assert (got["vision_out"], got["vision_heads"]) == (4096, 16)


def test_flat_text_only_layout_and_round_trip(tree):
    # The flat (text-only) layout and to_dict -> from_pretrained, as transformers' class reads them.
    proc = run(
        tree,
        """
        import tempfile
        from transformers import AutoConfig
        from glm5_next_hpu.hf_configs import register_configs
        assert register_configs() is True
        flat = AutoConfig.for_model("glm5_next", num_hidden_layers=4, hidden_size=64,
                                    layer_types=["linear_attention", "full_attention", "linear_attention", "indexed_attention"])
        t = flat.get_text_config()
        assert t.num_hidden_layers == 4 and t.hidden_size == 64, t
        assert t.layer_types == ["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"]
        assert t.mlp_layer_types == ["dense", "dense", "dense", "sparse"]
        d = tempfile.mkdtemp()
        flat.save_pretrained(d)
        again = AutoConfig.from_pretrained(d)
        assert again.get_text_config().to_dict() == t.to_dict()
        print("ok")
    """,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-3000:]
