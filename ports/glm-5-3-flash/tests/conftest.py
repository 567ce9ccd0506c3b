# The port folder (glm5_next_hpu) and the repository root (packtests) are on sys.path through
# `pythonpath` in the repository's pyproject.toml.
import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny():
    """(reference model, port model, config), weights moved through checkpoint-format keys."""
    from packtests import flash_reference as rh

    return rh.build_pair(seed=0)
