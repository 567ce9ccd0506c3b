"""The fixtures the runner e2e tests share, built once per session (the tests only read them):
vllm-gaudi's runner on the emulation; the pieces are in
packtests/mxfp4_runner.py, imported when a test asks for one: it skips outside .venv-cpu)."""

import pytest


@pytest.fixture(scope="session")
def tree(tmp_path_factory):
    """v0.30.0's development-base tree with the port applied, vLLM 0.27.0 beside it."""
    from packtests import mxfp4_runner

    return mxfp4_runner.development_tree(tmp_path_factory)


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """(bf16 source, converted MXFP4) of the tiny glm_moe_dsa."""
    from packtests import mxfp4_runner

    return mxfp4_runner.converted_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def constant_draft(ckpt, tmp_path_factory):
    """The converted checkpoint whose MTP draft is always token 0."""
    from packtests import mxfp4_runner

    return mxfp4_runner.fixed_draft(ckpt[1], tmp_path_factory)


@pytest.fixture(scope="session")
def reference(ckpt):
    """transformers' greedy tokens with the converter's dequantized experts."""
    from packtests import mxfp4_runner

    return mxfp4_runner.dequantized_greedy(ckpt)
