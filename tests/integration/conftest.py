"""Fixtures the integration tests share."""

import os

import pytest

from fixpack.sandbox.forkserver import ForkServer
from packtests.builders import REPO


@pytest.fixture
def server(tmp_path):
    """A fork server with this checkout on its path, closed after the test."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    s = ForkServer(env)
    yield s
    s.close()
