"""CPU checks of the kernel's Python side (the kernel itself runs only on a card: the sinkhorn
device gate). Run: pytest ports/glm-5-3-flash/kernels/sinkhorn/test_op.py"""

import importlib.util
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


@pytest.fixture()
def op(monkeypatch, tmp_path):
    monkeypatch.setenv("GLM5_NEXT_SINKHORN_LIB", str(tmp_path / "absent.so"))
    spec = importlib.util.spec_from_file_location("sinkhorn_op_under_test", HERE / "op.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def comb(rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, 4, 4, generator=g) * 3, dim=-1) + 1e-6


def test_without_the_library_it_falls_back_and_says_why(op):
    x = comb(7)
    out = op.mhc_sinkhorn(x)
    status = op.kernel_status()
    assert status["kernel"] is False and "not built" in status["why"]
    assert torch.equal(out, op.sinkhorn_tpc_order(x, 20, 1e-6))
    torch.testing.assert_close(out.sum(-2), torch.ones(7, 4), atol=1e-5, rtol=0)  # last step: columns


def test_fallback_matches_the_plugins_emulation_bit_for_bit(op):
    try:  # the port folder is on sys.path through `pythonpath` in the repository's pyproject.toml
        from glm5_next_hpu.mhc import sinkhorn_tpc_order
    except ImportError:
        pytest.skip("glm5_next_hpu.mhc not importable")
    for rows in (1, 3, 64, 1024):
        x = comb(rows, seed=rows)
        assert torch.equal(op.sinkhorn_tpc_order(x, 20, 1e-6), sinkhorn_tpc_order(x, 20, 1e-6))


def test_the_order_is_close_to_the_reference_loop(op):
    x = comb(32, seed=3)
    ref = x / (x.sum(-2, keepdim=True) + 1e-6)
    for _ in range(19):
        ref = ref / (ref.sum(-1, keepdim=True) + 1e-6)
        ref = ref / (ref.sum(-2, keepdim=True) + 1e-6)
    torch.testing.assert_close(op.sinkhorn_tpc_order(x, 20, 1e-6), ref, rtol=1e-5, atol=1e-6)
