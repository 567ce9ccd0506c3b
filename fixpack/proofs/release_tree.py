"""Helpers for tests that import the real release modules from a scratch tree.

Only hardware is stubbed: ``habana_frameworks`` (the Gaudi PyTorch bridge, not on PyPI)
becomes a synthetic package whose attributes are inert callables. Everything else is the
real vLLM / vllm-gaudi code read from the tree under test.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

TREE_ENV = "FIXPACK_TREE"
# The release (profile name) the tree under test is; `fixpack check` sets it. Tests marked
# ``releases("v0.30.0", ...)`` run only on the releases they name (fixpack.proofs.pytest_plugin).
RELEASE_ENV = "FIXPACK_RELEASE"


class _Inert:
    """Stands in for any habana object: callable, attribute-able, a no-op."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        return None

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self._name}.{item}")

    def __repr__(self) -> str:
        return f"<habana stub {self._name}>"

    def __bool__(self) -> bool:
        return False

    def __mro_entries__(self, bases):
        # `class X(habana.Something)` must still build a class.
        return (object,)


class _StubModule(types.ModuleType):
    # what the finder sets on the stub modules it makes
    __fixpack_stub__: bool
    is_available: Callable[[], bool]
    device_count: Callable[[], int]

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self.__name__}.{item}")


class _HabanaFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    prefix = "habana_frameworks"

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.prefix or fullname.startswith(self.prefix + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so submodules resolve through this finder
        module.__fixpack_stub__ = True
        return module

    def exec_module(self, module):
        if module.__name__ == "habana_frameworks.torch":
            import torch

            module.torch = torch
            # The real bridge registers the `hpu` device module on torch at import.
            if "hpu" not in vars(torch):
                hpu = _StubModule("torch.hpu")
                hpu.is_available = lambda: False
                hpu.device_count = lambda: 0
                setattr(torch, "hpu", hpu)  # noqa: B010 (torch has no such attribute to type-check)
        if module.__name__ == "habana_frameworks.torch.hpu":
            module.is_available = lambda: False
            module.device_count = lambda: 0


def install_habana_stub() -> None:
    """Make ``import habana_frameworks...`` succeed on a machine without Gaudi software."""
    if not any(isinstance(f, _HabanaFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _HabanaFinder())


def tree_from_env() -> Path:
    value = os.environ.get(TREE_ENV)
    if not value:
        raise RuntimeError(
            f"{TREE_ENV} is not set: fix tests run against a release tree; "
            "run them with `fixpack check`, or set "
            f"{TREE_ENV}=<folder holding vllm/ and vllm_gaudi/>"
        )
    path = Path(value).resolve()
    if not path.is_dir():
        raise RuntimeError(f"{TREE_ENV}={value}: not a folder")
    return path


def use_tree(tree: Path | str) -> Path:
    """Put ``tree`` first on sys.path and stub the hardware modules.

    Refuses when vllm or vllm_gaudi were already imported from elsewhere: a test must see
    the tree's bytes, never a copy imported earlier in the process.
    """
    tree = Path(tree).resolve()
    for pkg in ("vllm", "vllm_gaudi"):
        mod = sys.modules.get(pkg)
        where = getattr(mod, "__file__", None) if mod is not None else None
        if where and not Path(where).resolve().is_relative_to(tree):
            raise RuntimeError(f"{pkg} already imported from {where}, not from {tree}")
    if str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    # Stale bytecode must never stand in for a rewritten source file.
    sys.dont_write_bytecode = True
    install_habana_stub()
    return tree
