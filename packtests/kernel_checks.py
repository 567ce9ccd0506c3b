"""Comparison helpers of the emulation's kernel tests (emulation/tests/test_kernels_*.py)."""

import torch

# Stated tolerances: fp32 kernels vs float32 references; bf16 outputs carry one bf16 rounding
# (relative 2**-8) on values of order 1.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def close(a: torch.Tensor, b: torch.Tensor, dtype=torch.float32, **over) -> bool:
    tol = dict(TOL[dtype], **over)
    return torch.allclose(a.float(), b.float(), **tol)


def assert_close(a, b, dtype=torch.float32, **over):
    tol = dict(TOL[dtype], **over)
    torch.testing.assert_close(a.float(), b.float(), **tol)


# Where the project's own MXFP4 reference lives (ports/glm-5-mxfp4/glm5_mxfp4).
_REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
REPO_PATHS = [str(_REPO / "ports" / "glm-5-mxfp4")]
