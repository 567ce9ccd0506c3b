"""Tensor parallel 2 in two worker processes (vLLM's multiproc executor, ``spawn``), each serving
its shard through vllm-gaudi v0.26.0's own HPUModelRunner on the emulation; the collectives go
through the ``hccl`` process-group backend, which the emulation builds as gloo (card tensors reach
it unwrapped). Greedy tokens against transformers (bf16), batched and each prompt alone.

Each case is one engine process plus two workers (~60-110 s on 2 shared cores). The tolerance for
bf16 rounding: at TP 2 the row-parallel all-reduce adds bf16 partial sums, so results may differ
from the single-process reference in the last bit; tokens are compared up to the reference's
first near-tie (``packtests.runner_serve.TIE``); the prompts have none. Runs under ``.venv-cpu``.
"""

from __future__ import annotations

import sys

import pytest

from packtests import runner_serve as rs  # noqa: E402

_reason = rs.vllm_available()
if _reason:
    pytest.skip(_reason, allow_module_level=True)

sys.path.insert(0, str(rs.EMULATION))
from hpu_harness import tiny_models  # noqa: E402

# Per model, prompts whose reference greedy steps have no near-tie (smallest top-2 gap >= 0.094).
PROMPTS = {
    "llama": [
        [33, 183, 79, 99, 191, 106, 212, 166, 20, 0, 152, 49],
        [239, 173, 5],
        [230, 37, 79, 25, 186, 18, 230, 217, 175, 84, 120, 143],
        [229, 179, 236, 212],
    ],
    "deepseek_v2": [
        [33, 183, 79, 99, 191, 106, 212, 166, 20, 0, 152, 49],
        [194, 227, 107, 10, 66, 247, 130, 124, 103],
        [21, 83, 156, 29, 124, 150, 161, 85],
        [90, 111, 80, 156],
    ],
}
PROMPTS["qwen3_next"] = [
    [23, 184, 215],
    [183, 31, 122, 53, 186],
    [40, 61, 57, 163, 114, 96, 181, 224],
    [229, 179, 236, 212],
]
BUILDERS = {"llama": tiny_models.llama, "deepseek_v2": tiny_models.deepseek_v2, "qwen3_next": tiny_models.qwen3_next}
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    got = rs.release_tree(tmp_path_factory.mktemp("v0.26.0"))
    if isinstance(got, str):
        pytest.skip(got)
    return got


# qwen3_next: the gated delta-net's heads (2 key, 4 value) split over the two workers, each with
# its own GDN state slots; the full-attention layer's single KV head is replicated.
@pytest.mark.parametrize("name", ["llama", "deepseek_v2", "qwen3_next"])
def test_tp2_greedy_tokens_equal_transformers(tree, tmp_path, name):
    model = BUILDERS[name](tmp_path / name)
    reference = rs.reference_of(model, PROMPTS[name])
    proc, result, seconds = rs.serve(
        tree, model, PROMPTS[name], runtime_dir=tmp_path / "rt", engine=TP2, probe_workers=True
    )
    print(f"engine process (and its 2 workers) {seconds:.1f} s")
    print(result.get("workers"))
    assert result is not None, proc.stderr[-6000:]
    assert reference.check(result["batched"]) == 32
    assert reference.check(result["alone"]) == 32
    workers = sorted(result["workers"], key=lambda w: w["rank"])
    assert [w["rank"] for w in workers] == [0, 1] and len({w["pid"] for w in workers}) == 2
    for w in workers:
        assert w["world"] == 2 and w["tp_size"] == 2 and w["tp_rank"] == w["rank"]
        assert w["backend"] == "hccl" and w["device_group_backend"] == "hccl"
        assert w["devices"] == ["hpu:0"]
        # the vocab-parallel embedding holds half the (padded) vocabulary in each worker
        embed = next(s for n, s in w["shards"].items() if n.endswith("embed_tokens.weight"))
        assert embed[0] * 2 >= 256 and embed[0] < 256, w["shards"]
