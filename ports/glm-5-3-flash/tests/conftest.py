import sys
from pathlib import Path

PORT_ROOT = Path(__file__).resolve().parents[1]
if str(PORT_ROOT) not in sys.path:
    sys.path.insert(0, str(PORT_ROOT))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny():
    """(reference model, port model, config), weights moved through checkpoint-format keys."""
    import reference_harness as rh

    return rh.build_pair(seed=0)
