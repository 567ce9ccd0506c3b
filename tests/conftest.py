import pytest


@pytest.fixture()
def pack(tmp_path):
    """A synthetic pack with its lock, and a fresh pristine tree of its packages."""
    from packtests.builders import make_pack, new_tree, write_lock

    root = make_pack(tmp_path / "pack")
    write_lock(root)
    tree = new_tree(root, tmp_path / "tree")
    return root, tree


@pytest.fixture(autouse=True)
def _remove_deep_chains():
    """Every folder chain packtests.builders.deep_chain made is removed after its test, passed or
    not: pytest's own clean-up of old temporary folders recurses and would crash on it later."""
    from packtests import builders

    yield
    while builders.DEEP_CHAINS:
        chain = builders.DEEP_CHAINS.pop()
        if chain.parent.is_dir():
            builders.remove_tree(chain)
