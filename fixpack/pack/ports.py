"""The contract between fixpack and a port, written down in one place.

A port (ports/<name>/port.yaml) gives fixpack three kinds of piece, all declared in its
port.yaml and found only through it:

* ``switch_prefix`` and ``switches``: its environment switches, parsed by fixpack's one switch
  parser (:mod:`fixpack.pack.switches`), which the port's plugin uses too;
* ``hooks``: modules of the port's packages that fixpack calls, each named ``package.module``
  and checked against the Protocol below (:data:`HOOKS`). A hook imports by that name, from the
  environment where the port is installed or else from the port folder (the ``plugin.path``
  its packages live in);
* ``gates``: its device gates, run by fixpack's one gate runner (:mod:`fixpack.gates`).

A hook module is standard library only, so ``fixpack recipe check`` loads it without torch.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from fixpack.errors import ConfigError


@runtime_checkable
class RecipeRules(Protocol):
    """``hooks.recipe_rules``: the port's own serving rules, checked by ``fixpack recipe check``."""

    def recipe_problems(self, data: dict) -> list[tuple[str, str | None]]:
        """(rule, problem or None) for each rule a recipe (its parsed data) can break."""
        ...

    def missing_file_note(self, rel: str) -> str | None:
        """What a serving file the recipe names and the repository lacks is, and how it is made;
        None when the port has nothing to say about ``rel``."""
        ...


# hook name in port.yaml -> the Protocol its module satisfies
HOOKS: dict[str, type] = {"recipe_rules": RecipeRules}


def import_module_from(name: str, root: Path) -> ModuleType:
    """Import ``name`` with ``root`` (a port folder, or the folder its gates live in) first on
    sys.path for the import only; a module already imported keeps the place it came from."""
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(name)
    finally:
        try:
            sys.path.remove(str(root))
        except ValueError:
            pass


def hook(port: Any, name: str) -> Any | None:
    """The module a port declares for hook ``name`` (``port.yaml hooks.<name>``), checked against
    its Protocol; None when the port declares none. ConfigError naming the port.yaml and the hook
    when the declaration is wrong or the module does not load."""
    where = f"{port.dir / 'port.yaml'}: hooks.{name}"
    hooks = port.data.get("hooks") or {}
    if not isinstance(hooks, dict):
        raise ConfigError(f"{port.dir / 'port.yaml'}: key 'hooks' must be a mapping of hook: package.module")
    unknown = sorted(set(hooks) - set(HOOKS))
    if unknown:
        raise ConfigError(f"{port.dir / 'port.yaml'}: unknown hook(s) {', '.join(unknown)} (known: {', '.join(HOOKS)})")
    target = hooks.get(name)
    if target is None:
        return None
    if not isinstance(target, str) or not all(part.isidentifier() for part in target.split(".")):
        raise ConfigError(f"{where}: {target!r} is not a module name (package.module)")
    try:
        module = import_module_from(target, port.dir)
    except Exception as exc:  # the port's own code: any failure to import is this hook's error
        raise ConfigError(f"{where}: cannot import {target}: {type(exc).__name__}: {exc}") from exc
    protocol = HOOKS[name]
    missing = [m for m in _methods(protocol) if not callable(getattr(module, m, None))]
    if missing:
        raise ConfigError(f"{where}: module {target} lacks {', '.join(missing)} ({protocol.__name__})")
    return module


def _methods(protocol: type) -> list[str]:
    return [m for m, v in vars(protocol).items() if callable(v) and not m.startswith("_")]


def switch_problem(port: Any, name: str, value: str) -> str | None:
    """Why a recipe's ``value`` for switch ``name`` of ``port`` is refused, or None: fixpack's
    one switch parser, the one the port's plugin reads the switch with."""
    from fixpack.pack.switches import SwitchError, check_prefix, recipe_value_problem

    where = str(port.dir / "port.yaml")
    try:
        prefix = check_prefix(port.data.get("switch_prefix"), where)
    except SwitchError as exc:
        return str(exc)
    return recipe_value_problem(name, port.data["switches"][name], value, where, prefix)
