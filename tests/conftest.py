import pytest


@pytest.fixture()
def pack(tmp_path):
    """A synthetic pack with its lock, and a fresh pristine tree of its packages."""
    from packtests.builders import make_pack, new_tree, write_lock

    root = make_pack(tmp_path / "pack")
    write_lock(root)
    tree = new_tree(root, tmp_path / "tree")
    return root, tree
