"""The hpex wrappers and torch.ops.hpu kernels on the emulated ``hpu`` device.

Same results as on plain CPU tensors, one dispatch per kernel, and no host synchronisation
inside a captured (HPU graph) region: the wrappers never read values back to the host.
Needs the device layer (``hpu_emulation.device``); skipped where it is absent.
"""

import pytest
import torch

pytest.importorskip("hpu_emulation.device")
pytest.importorskip("hpu_emulation.counting")


@pytest.fixture(scope="module")
def hpu():
    import hpu_emulation

    hpu_emulation.activate()
    import habana_frameworks.torch  # noqa: F401  (registers the hpu device, as the bridge does)

    from hpu_emulation import counting

    return counting


def _calls():
    from habana_frameworks.torch.hpex.kernels import FusedSDPA, RotaryPosEmbeddingMode, apply_rotary_pos_emb
    from habana_frameworks.torch.hpex.kernels import fp8_fused_sdpa as fp8_sdpa
    from habana_frameworks.torch.hpex.normalization import FusedRMSNorm

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    lens = torch.tensor([4, 6])
    sinks = torch.randn(4, generator=g)
    x = torch.randn(5, 16, generator=g).to(torch.bfloat16)
    w12 = [torch.randn(8, 16, generator=g).to(torch.bfloat16) for _ in range(2)]
    w3 = [torch.randn(16, 4, generator=g).to(torch.bfloat16) for _ in range(2)]
    ids = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]])
    rw = torch.rand(5, 2, generator=g).to(torch.bfloat16)
    cos, sin = torch.rand(5, 1, 16, generator=g), torch.rand(5, 1, 16, generator=g)
    one = torch.tensor(1.0)
    q8 = q.to(torch.float8_e4m3fn)
    return {
        "fsdpa": (
            FusedSDPA.apply,
            (q, k, k, None, 0.0, True, None, "fast", True, lens, "right", False, False, (3, 0), sinks),
        ),
        "fp8_fsdpa": (lambda *a: fp8_sdpa(*a, d_scale_q=one, d_scale_k=one, d_scale_v=one)[0], (q8, q8, q8)),
        "rope": (apply_rotary_pos_emb, (x.view(5, 1, 16), cos, sin, None, 0, RotaryPosEmbeddingMode.PAIRWISE)),
        "rms": (FusedRMSNorm.apply, (x, torch.ones(16, dtype=torch.bfloat16), 1e-6)),
        "moe": (
            lambda *a: torch.ops.hpu.mixture_of_experts(
                hidden_states=a[0],
                expert_routing_table=a[1],
                router_weights=a[2],
                w12=list(a[3:5]),
                w3=list(a[5:7]),
                permuted_weights=True,
                activation="silu",
                experts_min=0,
                experts_max=1,
            ),
            (x, ids, rw, *w12, *w3),
        ),  # fmt: skip
        "cast": (lambda a, s: torch.ops.hpu.cast_to_fp8_v2(a, s, False, False, torch.float8_e4m3fn)[0], (x, one)),
    }


def _to(a, device):
    return a.to(device) if isinstance(a, torch.Tensor) else a


@pytest.mark.parametrize("name", ["fsdpa", "fp8_fsdpa", "rope", "rms", "moe", "cast"])
def test_same_result_on_hpu_no_host_sync(hpu, name):
    fn, args = _calls()[name]
    ref = fn(*args)
    hpu.strict(True)
    try:
        with hpu.step(f"kernel {name}") as rec, hpu.graph_region():
            got = fn(*(_to(a, "hpu") for a in args))
    finally:
        hpu.strict(False)
    assert got.device.type == "hpu"
    assert rec.syncs == []
    assert torch.equal(got.cpu().float(), ref.float())


def test_negative_control_host_sync_is_caught(hpu):
    """A wrapper that reads a scale back to the host (.item()) is rejected by the same check."""
    x = torch.randn(4, 8).to("hpu")
    scale = torch.tensor(2.0).to("hpu")
    hpu.strict(True)
    try:
        with pytest.raises(hpu.HostSyncInGraph), hpu.step("bad wrapper"), hpu.graph_region():
            torch.ops.hpu.cast_to_fp8_v2(x, scale.item(), False, False, torch.float8_e4m3fn)
    finally:
        hpu.strict(False)
