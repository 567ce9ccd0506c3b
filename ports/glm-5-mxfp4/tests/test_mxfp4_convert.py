"""The converter on a tiny glm_moe_dsa checkpoint made by transformers 5.23.0 (packtests/glm_moe_dsa_tiny.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from glm5_mxfp4 import convert, mxfp4
from packtests import glm_moe_dsa_tiny
from packtests.mxfp4_convert import PORT_ROOT, main, run_cli, tree

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return Path(glm_moe_dsa_tiny.make(str(tmp_path_factory.mktemp("src") / "GLM-tiny-BF16")))


@pytest.fixture(scope="module")
def converted(src, tmp_path_factory) -> Path:
    """The recipe's shape: layer-range workers, the other worker, then --finalize."""
    dst = tmp_path_factory.mktemp("dst") / "GLM-tiny-MXFP4"
    assert main(src, dst, "--layers", "0:2", "--quiet") == 0
    assert main(src, dst, "--layers", "2:4", "--quiet") == 0
    assert main(src, dst, "--other", "--quiet") == 0
    assert main(src, dst, "--finalize", "--quiet") == 0
    return dst


def test_the_tiny_checkpoint_is_what_the_hub_stores(src):
    index = json.loads((src / "model.safetensors.index.json").read_text())
    keys = index["weight_map"]
    shards = set(keys.values())
    assert len(shards) >= 4
    assert "model.layers.0.mlp.gate_proj.weight" in keys  # dense first layer
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in keys  # per-expert layout
    assert "model.layers.3.eh_proj.weight" in keys and "model.layers.3.mlp.experts.0.down_proj.weight" in keys  # MTP
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in keys
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["model_type"] == "glm_moe_dsa" and cfg["num_hidden_layers"] == 3


def test_output_layout_index_and_config(src, converted):
    index = json.loads((converted / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    src_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    experts = [k for k in src_map if ".mlp.experts." in k and ".shared_experts." not in k]
    assert len(experts) == 3 * 8 * 3  # layers 1, 2 and the MTP layer 3
    assert set(weight_map) == set(src_map) | {k + "_scale" for k in experts}
    total = 0
    for file in sorted(set(weight_map.values())):
        with safe_open(str(converted / file), "pt") as f:
            assert sorted(f.keys()) == sorted(k for k, v in weight_map.items() if v == file)
            for k in f.keys():
                t = f.get_tensor(k)
                total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    with safe_open(str(converted / weight_map["model.layers.2.mlp.experts.5.down_proj.weight"]), "pt") as f:
        w = f.get_tensor("model.layers.2.mlp.experts.5.down_proj.weight")
        s = f.get_tensor("model.layers.2.mlp.experts.5.down_proj.weight_scale")
        bias = f.get_tensor("model.layers.2.mlp.gate.e_score_correction_bias")
    assert (w.dtype, tuple(w.shape), s.dtype, tuple(s.shape)) == (torch.uint8, (64, 32), torch.uint8, (64, 2))
    assert bias.dtype == torch.float32
    cfg = json.loads((converted / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    assert cfg == json.loads((src / "config.json").read_text())
    assert qc["quant_method"] == "mxfp4" and qc["scale_mode"] == "even" and qc["block_size"] == 32
    assert qc["source_index_sha256"] == hashlib.sha256((src / "model.safetensors.index.json").read_bytes()).hexdigest()
    assert "low nibble" in qc["layout"] and qc["modules"]
    for name in glm_moe_dsa_tiny.TOKENIZER_FILES:
        assert (converted / name).read_bytes() == (src / name).read_bytes()


def test_every_other_tensor_is_copied_byte_for_byte(src, converted):
    src_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    out_map = json.loads((converted / "model.safetensors.index.json").read_text())["weight_map"]
    for key, shard in src_map.items():
        a = load_file(str(src / shard))[key]
        if mxfp4_key(key):
            q, s = mxfp4.quantize(a, "even")
            out = load_file(str(converted / out_map[key]))
            np.testing.assert_array_equal(out[key].numpy(), q)
            np.testing.assert_array_equal(out[key + "_scale"].numpy(), s)
        else:
            b = load_file(str(converted / out_map[key]))[key]
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), key


def mxfp4_key(key: str) -> bool:
    return ".mlp.experts." in key and ".shared_experts." not in key


def test_verify_passes_and_workers_give_the_same_bytes(src, converted, tmp_path):
    assert "equal to a re-quantization" in run_cli("verify", src, converted, check=True).stdout
    assert "not sampled" in run_cli("verify", src, converted, "--sample", "1", check=True).stdout
    other = tmp_path / "workers"
    run_cli(src, other, "--workers", "2", "--quiet", check=True)
    assert tree(other, hidden=False) == tree(converted, hidden=False)


PIPELINE_VARIANTS = {
    # a file system without O_DIRECT (tmpfs): plain writes, fdatasync-ed every few bytes
    "plain writes": {"DIRECT_WRITES": False, "SYNC_EVERY": 5000},
    # O_DIRECT through a 3-block staging buffer (many flushes with a partial block carried over),
    # more compute threads than buffers in flight
    "small stage, few buffers": {"STAGE": 3 * 4096, "IN_SLOTS": 3, "OUT_SLOTS": 2, "threads": 3},
    "one compute thread": {"threads": 1, "CHUNK": 4096},
    # one-block staging buffers and four direct writes in flight: they land out of order
    "many writes in flight": {"STAGE": 4096, "WRITE_DEPTH": 4},
    "one write in flight": {"WRITE_DEPTH": 1},
}


@pytest.mark.parametrize("variant", list(PIPELINE_VARIANTS))
def test_pipeline_variants_write_the_same_bytes(src, converted, tmp_path, monkeypatch, variant):
    from glm5_mxfp4 import pipeline

    for name, value in PIPELINE_VARIANTS[variant].items():
        if name == "threads":
            monkeypatch.setattr(pipeline, "compute_threads", lambda value=value: value)
        else:
            monkeypatch.setattr(pipeline, name, value)
    dst = tmp_path / "dst" / "GLM-tiny-MXFP4"
    assert main(src, dst, "--layers", "0:2", "--quiet") == 0
    assert main(src, dst, "--layers", "2:4", "--quiet") == 0
    assert main(src, dst, "--other", "--quiet") == 0
    assert main(src, dst, "--finalize", "--quiet") == 0
    assert tree(dst) == tree(converted)  # the state folder too: same input and output hashes


def test_output_file_direct_staging_and_fallback(tmp_path, monkeypatch):
    from glm5_mxfp4 import pipeline

    monkeypatch.setattr(pipeline, "STAGE", 2 * 4096)
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1, 4095, 4096, 4097, 20000, 0, 3, 8192, 12345)]
    want = b"".join(p.tobytes() for p in parts)

    def write_all(path):
        """Whether the file was opened for direct writes, and whether they were still on at the end."""
        out = pipeline.OutputFile(str(path))
        opened_direct = out.direct
        try:
            for p in parts:
                out.write(memoryview(p))
            still_direct = out.direct
            out.finish()
            assert out.written == len(want)
        finally:
            out.close()
        return opened_direct, still_direct

    direct, _ = write_all(tmp_path / "direct")
    assert (tmp_path / "direct").read_bytes() == want
    if not direct:
        pytest.skip("no O_DIRECT where the tests write: only the plain path ran")
    # a file system that opens with O_DIRECT but refuses the writes: the rest goes the plain way
    import fcntl

    real_pwrite = os.pwrite
    refused = []

    def refusing_pwrite(fd, data, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(22, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refusing_pwrite)
    _, still_direct = write_all(tmp_path / "fallback")
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert (tmp_path / "fallback").read_bytes() == want
    assert refused and not still_direct


def test_verify_catches_a_changed_byte(src, converted, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(converted, bad)
    weight_map = json.loads((bad / "model.safetensors.index.json").read_text())["weight_map"]
    key = "model.layers.1.mlp.experts.3.up_proj.weight"
    path = bad / weight_map[key]
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors[key][0, 0] ^= 0x11
    save_file(tensors, str(path), metadata={"format": "pt"})
    proc = run_cli("verify", src, bad)
    assert proc.returncode == 3 and key in proc.stderr


def test_logits_through_transformers(src, converted, tmp_path):
    """The output, dequantized, loaded into transformers' model: logits equal the model whose experts
    were quantized and dequantized in memory, and stay close to BF16."""
    from transformers import GlmMoeDsaForCausalLM

    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 24))
    ref = GlmMoeDsaForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        bf16_logits = ref(ids).logits.float()
        # in memory: transformers fuses the experts as gate_up_proj [E, 2I, H], down_proj [E, H, I];
        # blocks run along the last (input) axis either way
        qdq = GlmMoeDsaForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16).eval()
        n, err2, ref2 = 0, 0.0, 0.0
        for name, p in qdq.named_parameters():
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                new = torch.from_numpy(mxfp4.dequantize(*mxfp4.quantize(p.data, "even"))).bfloat16()
                err2 += float((new.float() - p.float()).norm() ** 2)
                ref2 += float(p.float().norm() ** 2)
                p.copy_(new)
                n += 1
        assert n == 2 * 2  # layers 1 and 2 (transformers drops the MTP layer)
        qdq_logits = qdq(ids).logits.float()
    # the converted checkpoint, dequantized by key into the Hub layout, loaded the ordinary way
    back = tmp_path / "dequantized"
    back.mkdir()
    out_map = json.loads((converted / "model.safetensors.index.json").read_text())["weight_map"]
    new_map = {}
    for file in sorted(set(out_map.values())):
        tensors = load_file(str(converted / file))
        for key in [k for k in tensors if k.endswith("_scale")]:
            base = key[: -len("_scale")]
            tensors[base] = torch.from_numpy(
                mxfp4.dequantize(tensors[base].numpy(), tensors.pop(key).numpy())
            ).bfloat16()
        save_file(tensors, str(back / file), metadata={"format": "pt"})
        new_map.update({k: file for k in tensors})
    (back / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": new_map}))
    cfg = json.loads((converted / "config.json").read_text())
    cfg.pop("quantization_config")
    (back / "config.json").write_text(json.dumps(cfg))
    loaded = GlmMoeDsaForCausalLM.from_pretrained(str(back), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        logits = loaded(ids).logits.float()
    assert torch.equal(logits, qdq_logits)
    # stated bound: the logits move (relative Frobenius norm) by less than the experts' weights do
    weight_rel = (err2 / ref2) ** 0.5
    rel = float((logits - bf16_logits).norm() / bf16_logits.norm())
    assert 0.09 < weight_rel < 0.12 and 0 < rel < weight_rel, (rel, weight_rel)


def test_keys_shapes_dtypes_are_what_vllm_030_creates(converted):
    from fixpack.errors import SourceUnavailable
    from fixpack.sources import sources

    try:
        tree_root = sources.wheel_tree("vllm", "0.30.0", "vllm")
    except SourceUnavailable as exc:
        pytest.skip(f"vLLM 0.30.0 wheel unavailable: {exc}")
    # vLLM 0.30.0's tree first, then the port folder and the repository root (packtests): `vllm`
    # is 0.30.0 in that process only
    path = os.pathsep.join(
        [str(tree_root), str(PORT_ROOT), str(PORT_ROOT.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, str(TESTS / "vllm030_check.py"), str(tree_root), str(converted)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["vllm_file"].startswith(str(tree_root))
    for mode in mxfp4.SCALE_MODES:
        d = res["dequant"][mode]
        assert d["equal_outside_code0"] and d["vllm_code0_is_zero"] and d["code0_elements"] < d["elements"]
    assert res["problems"] == []
    assert res["moe_layers"] == ["model.layers.1", "model.layers.2", "model.layers.3"]
    assert res["mapped_and_copied"] == 3 * 8 * 3 * 2
    E, H, inter = 8, 64, 64
    assert res["params"]["model.layers.3.w13_weight"] == ["torch.uint8", [E, 2 * inter, H // 2]]
    assert res["params"]["model.layers.3.w13_weight_scale"] == ["torch.uint8", [E, 2 * inter, H // 32]]
    assert res["params"]["model.layers.3.w2_weight"] == ["torch.uint8", [E, H, inter // 2]]
    assert res["params"]["model.layers.3.w2_weight_scale"] == ["torch.uint8", [E, H, inter // 32]]


# ---- refusals: a clear message naming the file and the item, exit 2, nothing written ------------
def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(src, dst)
    return dst


def _rewrite(shard: Path, fn) -> None:
    tensors = load_file(str(shard))
    fn(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _shard_of(src: Path, key: str) -> Path:
    return src / json.loads((src / "model.safetensors.index.json").read_text())["weight_map"][key]


EXPERT = "model.layers.2.mlp.experts.6.gate_proj.weight"


def _fp8_config(s: Path):
    cfg = json.loads((s / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (s / "config.json").write_text(json.dumps(cfg))


def _fp8_tensor(s: Path):
    _rewrite(
        _shard_of(s, "model.layers.1.self_attn.o_proj.weight"),
        lambda t: t.update(
            {
                "model.layers.1.self_attn.o_proj.weight": t["model.layers.1.self_attn.o_proj.weight"].to(
                    torch.float8_e4m3fn
                )
            }
        ),
    )


def _model_type(s: Path):
    cfg = json.loads((s / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "deepseek_v3", ["DeepseekV3ForCausalLM"]
    (s / "config.json").write_text(json.dumps(cfg))


def _missing_shard(s: Path):
    _shard_of(s, EXPERT).unlink()


def _entry_not_in_shard(s: Path):
    index = json.loads((s / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.1.mlp.experts.8.up_proj.weight"] = index["weight_map"][EXPERT]
    (s / "model.safetensors.index.json").write_text(json.dumps(index))


def _non_finite(s: Path):
    def put(t):
        t[EXPERT][17, 40] = float("nan")

    _rewrite(_shard_of(s, EXPERT), put)


def _axis(s: Path):
    _rewrite(_shard_of(s, EXPERT), lambda t: t.update({EXPERT: torch.zeros(64, 48, dtype=torch.bfloat16)}))


REFUSALS = {
    "fp8 config": (_fp8_config, ["config.json", "quantization_config", "BF16 release"]),
    "fp8 dtype": (_fp8_tensor, ["model.layers.1.self_attn.o_proj.weight", "F8_E4M3", "BF16 release"]),
    "model type": (_model_type, ["config.json", "deepseek_v3", "glm_moe_dsa"]),
    "missing shard": (_missing_shard, ["model.safetensors.index.json", "which is missing", "first tensor"]),
    "index entry not in shard": (_entry_not_in_shard, ["model.layers.1.mlp.experts.8.up_proj.weight", "does not hold"]),
    "non-finite": (_non_finite, [EXPERT, "non-finite", "nan", "[17, 40]"]),
    "axis": (_axis, [EXPERT, "[64, 48]", "multiple of 32"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals(src, tmp_path, capsys, case):
    mutate, words = REFUSALS[case]
    s = _copy(src, tmp_path)
    mutate(s)
    dst = tmp_path / "dst"
    assert main(s, dst, "--workers", "1", "--quiet") == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, (w, err)
    assert not dst.exists()


def test_non_finite_in_a_later_unit_rolls_back_the_whole_run(src, tmp_path, capsys):
    s = _copy(src, tmp_path)
    _non_finite(s)  # layer 2: layers 0, 1 and "other" are converted before it is reached
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / ".glm5_mxfp4").mkdir()  # an empty state folder (a run that never got going)
    before = tree(dst)
    assert main(s, dst, "--layers", "0:4", "--quiet") == 2
    assert "[17, 40]" in capsys.readouterr().err
    assert tree(dst) == before and sorted(os.listdir(dst / ".glm5_mxfp4")) == []


def test_dst_holding_another_conversion(src, converted, tmp_path, capsys):
    before = tree(converted)
    assert main(src, converted, "--workers", "1", "--scale-mode", "floor", "--quiet") == 2
    err = capsys.readouterr().err
    assert "plan.json" in err and "another conversion" in err and "scale_mode" in err
    other_src = _copy(src, tmp_path)
    index = json.loads((other_src / "model.safetensors.index.json").read_text())
    index["metadata"]["note"] = "another release"
    (other_src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert main(other_src, converted, "--other", "--quiet") == 2
    assert "source_index_sha256" in capsys.readouterr().err
    assert tree(converted) == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(src, foreign, "--workers", "1", "--quiet") == 2
    assert "notes.txt" in capsys.readouterr().err and sorted(os.listdir(foreign)) == ["notes.txt"]


def test_finalize_refuses_missing_and_stale_units(src, tmp_path, capsys):
    dst = tmp_path / "dst"
    assert main(src, dst, "--layers", "0:2", "--quiet") == 0
    assert main(src, dst, "--finalize", "--quiet") == 2
    err = capsys.readouterr().err
    assert "3 of 5 units are not finished" in err and "layer-2: not converted" in err and "other" in err
    assert not (dst / "model.safetensors.index.json").exists() and not (dst / "config.json").exists()
    assert main(src, dst, "--layers", "2:4", "--quiet") == 0 and main(src, dst, "--other", "--quiet") == 0
    # a source shard rewritten since (same tensors, another header): its units are stale
    s = _copy(src, tmp_path)
    shutil.rmtree(dst)
    assert main(s, dst, "--workers", "1", "--quiet") == 0
    shard = _shard_of(s, "model.layers.1.mlp.experts.0.down_proj.weight")
    save_file(load_file(str(shard)), str(shard), metadata={"format": "pt", "rewritten": "yes"})
    assert main(s, dst, "--finalize", "--quiet") == 2
    assert "stale" in capsys.readouterr().err
    assert main(s, dst, "--workers", "1", "--quiet") == 0  # rerunning redoes exactly the stale units
    assert run_cli("verify", s, dst).returncode == 0


def test_overlapping_ranges_are_refused(src, tmp_path, capsys):
    dst = tmp_path / "dst"
    assert main(src, dst, "--layers", "0:2", "--quiet") == 0
    before = tree(dst)
    assert main(src, dst, "--layers", "1:3", "--quiet") == 2
    err = capsys.readouterr().err
    assert "layers-0-2" in err and "layer-1" in err and "overlaps" in err
    assert main(src, dst, "--task-index", "0", "--task-count", "2", "--quiet") == 2
    assert tree(dst) == before
    assert main(src, dst, "--layers", "0:2", "--quiet") == 0  # the same worker again resumes (nothing to do)
    assert tree(dst) == before


def test_scheduler_tasks_as_separate_processes(src, converted, tmp_path):
    """Kubernetes Indexed Job (JOB_COMPLETION_INDEX) and Slurm array (SLURM_ARRAY_TASK_ID) tasks,
    started at once into one shared folder each, then one --finalize."""
    k8s, slurm = tmp_path / "k8s", tmp_path / "slurm"
    procs = []
    env = {k: "" for k in convert.TASK_INDEX_ENV}
    for i in range(3):
        for dst, var, value in ((k8s, "JOB_COMPLETION_INDEX", i), (slurm, "SLURM_ARRAY_TASK_ID", i + 1)):
            extra = dict(env, **{var: str(value)})
            if var.startswith("SLURM"):
                extra.update(SLURM_ARRAY_TASK_MIN="1", SLURM_ARRAY_TASK_COUNT="3")
                args = [src, dst, "--task-index", "auto", "--quiet"]
            else:
                args = [src, dst, "--task-index", "auto", "--task-count", "3", "--quiet"]
            full = dict(os.environ, **extra, PYTHONPATH=str(PORT_ROOT))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "glm5_mxfp4.convert", *map(str, args)],
                    cwd=PORT_ROOT,
                    env=full,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    for dst in (k8s, slurm):
        assert sorted(os.listdir(dst / ".glm5_mxfp4" / "claims")) == [f"task-{i}-of-3.json" for i in range(3)]
        run_cli(src, dst, "--finalize", "--quiet", check=True)
        assert tree(dst, hidden=False) == tree(converted, hidden=False)
    proc = run_cli(src, tmp_path / "none", "--task-index", "auto", "--task-count", "3", env=env)
    assert proc.returncode == 2 and "JOB_COMPLETION_INDEX" in proc.stderr


def test_workers_stop_and_remove_a_new_dst_when_one_task_refuses(src, tmp_path):
    s = _copy(src, tmp_path)
    _non_finite(s)
    dst = tmp_path / "dst"
    proc = run_cli(s, dst, "--workers", "2", "--quiet")
    assert proc.returncode == 2
    assert "[17, 40]" in proc.stderr and "removed (this run created it)" in proc.stderr
    assert not dst.exists()


def test_progress_prints_plain_lines_when_not_a_terminal():
    import io

    from glm5_mxfp4.progress import Progress

    out = io.StringIO()  # not a terminal: no bar, periodic lines
    p = Progress("layers-0-2", 4_000_000_000, 4, every=0.0, stream=out)
    p.advance(1_000_000_000, 1)
    p.advance(3_000_000_000, 3)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[layers-0-2] 1.00/4.00 GB, 1/4 tensors,") and "ETA" in lines[0]
    assert lines[-1].startswith("[layers-0-2] 4.00/4.00 GB, 4/4 tensors,") and lines[-1].endswith("done")
    quiet = io.StringIO()
    q = Progress("x", 10, 1, quiet=True, every=0.0, stream=quiet)
    q.advance(10, 1)
    q.close()
    assert quiet.getvalue() == ""
