"""pytest plugin for fix tests: ``python -m pytest -p fixpack.testing.plugin fixes/<id>``.

Gives the fixture ``tree``: the release tree under test (FIXPACK_TREE), already first on
sys.path with the hardware stubbed.
"""

from __future__ import annotations

import pytest

from fixpack.testing import tree_from_env, use_tree


@pytest.fixture(scope="session")
def tree():
    return use_tree(tree_from_env())
