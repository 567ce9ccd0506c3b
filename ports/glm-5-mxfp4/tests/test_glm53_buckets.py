"""serving/tp8-seqs4-128k.txt (VLLM_BUCKETING_FROM_FILE): made by glm5_hpu/buckets.py from vllm-gaudi's
own bucketing code at the v0.30.0 development base (091bbad), read back by vllm-gaudi's own file reader
and bucketing manager. vllm-gaudi runs in child processes: it caches its config per process. Pure Python
on CPU (numpy, packaging); skipped where the fixpack source cache has no vllm-gaudi 091bbad."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glm5_hpu import buckets

PORT = Path(__file__).resolve().parents[1]
REPO = PORT.parents[1]
COMMITTED = PORT / "serving" / "tp8-seqs4-128k.txt"
RECIPE = REPO / buckets.RECIPE


@pytest.fixture(scope="module")
def tree() -> Path:
    from fixpack.errors import SourceUnavailable
    from fixpack.sources.sources import git_tree

    try:
        # no URL: never fetch, only the cache's clone (tests run offline)
        return git_tree("vllm-gaudi", buckets.VLLM_GAUDI_COMMIT, "vllm_gaudi")
    except SourceUnavailable as exc:
        pytest.skip(f"the fixpack source cache has no vllm-gaudi {buckets.VLLM_GAUDI_COMMIT[:7]}: {exc}")


def command(tree: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(PORT))
    env["VLLM_BUCKETING_FROM_FILE"] = "/nonexistent"  # the command drops it: the file is not read when made
    return subprocess.run(
        [sys.executable, "-m", "glm5_hpu.buckets", "--tree", str(tree), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def dump(tree: Path, *args: str) -> dict:
    proc = command(tree, "dump", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def rows(values) -> set[tuple[int, int, int]]:
    return {tuple(v) for v in values}


def test_geometry_is_the_recipes():
    from fixpack.pack.recipe import load_recipe

    recipe = load_recipe(RECIPE)
    args = dict(recipe.args())
    g = buckets.Geometry()
    assert (g.max_model_len, g.max_num_seqs, g.block_size, g.max_num_batched_tokens) == (
        args["--max-model-len"],
        args["--max-num-seqs"],
        args["--block-size"],
        args["--max-num-batched-tokens"],
    )
    assert g.num_speculative_tokens == args["--speculative-config"]["num_speculative_tokens"]
    assert "--no-enable-prefix-caching" not in args and g.prefix_caching
    exported = {name: value for _, name, value in recipe.exports()}
    assert exported["VLLM_BUCKETING_FROM_FILE"] == "$COOKBOOK/" + COMMITTED.relative_to(REPO).as_posix()
    # none of the recipe's other exports is a variable vllm-gaudi's bucketing reads
    assert not [
        n
        for n in exported
        if n.startswith(
            (
                "VLLM_PROMPT_",
                "VLLM_DECODE_",
                "VLLM_BUCKETING_STRATEGY",
                "VLLM_CONTIGUOUS_PA",
                "VLLM_EXPONENTIAL_BUCKETING",
                "PT_HPU_SDPA_QKV_SLICE_MODE_FWD",
                "VLLM_ENABLE_BUCKETING",
            )
        )
    ]


def test_the_committed_file_is_what_vllm_gaudi_generates(tree, tmp_path):
    out = tmp_path / "buckets.txt"
    proc = command(tree, "write", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == COMMITTED.read_bytes()


def test_vllm_gaudi_reads_every_exponential_bucket_and_the_batch_3_rows(tree):
    exponential = dump(tree)
    from_file = dump(tree, "--from-file", str(COMMITTED))
    # vllm-gaudi's file reader (FileBucketingStrategy) on the committed file
    assert rows(from_file["file_prompt"]) == rows(exponential["prompt"])
    batch3 = rows(from_file["file_decode"]) - rows(exponential["seed_decode"])
    assert rows(exponential["seed_decode"]) <= rows(from_file["file_decode"])
    # batch size 3 on every block bucket batch size 4 has, capped at 3 x 1024 blocks (max_model_len 131072)
    assert batch3 == {(3, 1, min(b[2], 3 * 1024)) for b in exponential["seed_decode"] if b[0] == 4}
    assert (3, 1, 3072) in batch3 and len(batch3) == 13
    # the runner's manager with VLLM_BUCKETING_FROM_FILE: nothing filtered out, the same MTP expansion
    assert rows(from_file["prompt"]) == rows(exponential["prompt"])
    assert rows(from_file["seed_decode"]) == rows(from_file["file_decode"])
    assert rows(exponential["decode"]) <= rows(from_file["decode"])
    assert {(6, 1, 3072), (6, 1, 6144)} <= rows(from_file["decode"])  # 3 requests x (1 + 1 MTP token)
    assert all(q == 1 for _, q, _ in from_file["decode"])  # MTP does not change the decode query length


def test_check_accepts_the_committed_file(tree):
    proc = command(tree, "check", str(COMMITTED))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "corrupt, words",
    [
        (lambda t: t.replace("(3, 1, 1292)\n", ""), "no decode (seed rows) bucket [(3, 1, 1292)]"),
        (
            lambda t: t.replace("(1, 8192, 960)\n", "(1, 8192, 960\n"),
            "vllm-gaudi's bucketing fails reading it (AttributeError",
        ),
        (lambda t: t.replace("(4, 1, 4096)\n", "(4, 2, 4096)\n"), "no decode (seed rows) bucket [(4, 1, 4096)]"),
        (lambda t: t + "(2, 1, 9999)\n", "differs from what vllm-gaudi's bucketing generates"),
    ],
    ids=["batch-3-row-dropped", "prompt-row-unparsable", "decode-row-made-prompt", "row-added"],
)
def test_check_refuses_a_corrupted_file(tree, tmp_path, corrupt, words):
    text = COMMITTED.read_text()
    bad = tmp_path / "buckets.txt"
    bad.write_text(corrupt(text))
    assert bad.read_text() != text
    proc = command(tree, "check", str(bad))
    assert proc.returncode == 1 and words in proc.stderr, proc.stderr
