"""Schemas for fix.yaml, profiles and ports, declared once as data.

Loading is always yaml.safe_load; every error names the file and the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from fixpack.errors import ConfigError

SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")

# key: (types, required, description)
FIX_SCHEMA: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "id": ((str,), True, "slug, equal to the folder name"),
    "summary": ((str,), True, "one line"),
    "why": ((str,), True, "the defect: what goes wrong, for which requests"),
    "evidence": ((str,), False, "where in the pinned source the defect is shown"),
    "change": ((str,), False, "what the fix changes"),
    "kind": ((str,), True, "diff, edit or codemod"),
    "targets": ((list,), True, "list of {package, path}"),
    "upstream": ((str, dict, type(None)), True, "upstream commit/PR, or none"),
    "forwarded": ((str, bool, type(None)), False, "whether and where it was sent upstream"),
    "remove_when": ((str,), True, "when the fix can be retired"),
    "tests": ((list,), True, "test files in the fix folder"),
    "cpu_demonstrable": ((bool,), False, "false when the defect needs a Gaudi card to show"),
    "device_gate": ((dict,), False, "{reason, gate}: where the card check lives"),
    "requires": ((list,), False, "fix ids that must be applied before this one"),
    "regression_guards": ((list,), False, "tests that pass before the fix too: they guard what it must keep"),
    "untested_parts": ((list,), False, "[{part, why}]: hunks / edits no CPU test can turn red, and why"),
    "completed_by": ((list,), False, "later fix ids without which this one is incomplete at run time"),
    "pins_defect_tests": ((list,), False, "[{suite, test, why}]: an upstream test that passes on the pristine release and fails with the fix because it pins the very defect the fix removes"),
    "notes": ((str,), False, "anything else"),
    "releases": ((dict,), True, "each release's status: {<profile>: {status: applies|refreshed|upstream|dropped|not-affected, ...}}; a fix of the profile layer has one for every profile of the pack, a port's fix for its port's profile"),
}

# The status of a fix on one release (a profile name), under fix.yaml's ``releases:``.
#   applies    the fix's shared change file applies (no release folder of its own)
#   refreshed  the release has its own change file in <fix>/<release>/; ``why`` says what moved
#   upstream   the release has the fix already; ``evidence`` says where (``upstream``: the PR/commit)
#   dropped    left out on purpose although the release has the defect; ``why`` says why
#   not-affected  the release never had the defect (the code it fixes is absent or different);
#              ``why`` says what the release has instead
RELEASE_STATUSES = ("applies", "refreshed", "upstream", "dropped", "not-affected")

# Keys of a release entry that replace the fix-level key of the same name on that release
# (what the change meets moved: the evidence, the parts, the guards).
RELEASE_OVERRIDES = ("evidence", "change", "notes", "untested_parts", "regression_guards", "pins_defect_tests", "requires", "completed_by", "remove_when")

RELEASE_SCHEMA: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "status": ((str,), True, "applies, refreshed, upstream, dropped or not-affected"),
    "why": ((str,), False, "refreshed: what moved; dropped: why it is left out; not-affected: why the release has no such defect; upstream: what upstream did"),
    "upstream": ((str,), False, "upstream: the commit or PR that carries the fix"),
    **{k: (FIX_SCHEMA[k][0], False, FIX_SCHEMA[k][2] + " (on this release)") for k in RELEASE_OVERRIDES},
}
# what each status must say, and the keys only a status that applies a change may carry
RELEASE_REQUIRED = {"applies": (), "refreshed": ("why",), "upstream": ("evidence",), "dropped": ("why",), "not-affected": ("why",)}
RELEASE_APPLIED = ("applies", "refreshed")

TARGET_SCHEMA = {
    "package": ((str,), True, "top-level package folder, e.g. vllm_gaudi"),
    "path": ((str,), True, "file path inside the package"),
}

PINS_DEFECT_TEST_SCHEMA = {
    "suite": ((str,), True, "the upstream suite, e.g. 'vllm-gaudi tests/unit_tests' (run by emulation/hpu_harness/unit_tests.py)"),
    "test": ((str,), True, "the test id inside that suite, FILE::NAME (every parametrization) or FILE::NAME[PARAMS]"),
    "why": ((str,), True, "what the test asserts that is the defect, and what it sees with the fix"),
}

DEVICE_GATE_SCHEMA = {
    "reason": ((str,), True, "why CPU cannot show the defect"),
    "gate": ((str,), True, "the device gate that measures it"),
}

PROFILE_SCHEMA = {
    "name": ((str,), True, "profile name, equal to the file stem"),
    "description": ((str,), False, ""),
    "base": ((dict,), True, "what the profile applies to"),
    "packages": ((list,), True, "package folders the fixes may touch"),
    "fixes": ((list,), True, "ordered fixes (the pack order); each fix's status on this release is in its fix.yaml"),
}

PROFILE_FIX_SCHEMA = {
    "id": ((str,), True, "a fix folder under fixes/"),
    "opt_in": ((bool,), False, "applied only when named on the command line"),
}

# Keys of the layout before fix-centric folders, with what replaced them (a clearer error
# than "unknown key" for a profile written for the old layout).
PROFILE_RETIRED_KEYS = {
    "fixes_dir": "a fix's per-release change now lives in fixes/<id>/<release>/, named by the fix's fix.yaml `releases:`",
    "dir": "every fix lives in fixes/<id>/; its status on this release is in fixes/<id>/fix.yaml `releases:`",
}

PORT_SCHEMA = {
    "name": ((str,), True, "port name, equal to its folder"),
    "description": ((str,), False, ""),
    "profile": ((str,), True, "the base profile"),
    "patches": ((list,), True, "ordered source patches (fix ids under the port's fixes/)"),
    "plugin": ((dict,), True, "the plugin package"),
    "kernel": ((dict,), False, "the TPC kernel build"),
    "gates": ((dict,), False, "device gates, run by fixpack's gate runner (fixpack/gates/)"),
    "switch_prefix": ((str,), False, "the start every switch name shares (GLM_), with switches"),
    "switches": ((dict,), False, "environment switches, parsed by fixpack/pack/switches.py"),
    "hooks": ((dict,), False, "hook: package.module fixpack calls (fixpack/pack/ports.py HOOKS)"),
}


_LOADER = None


def _strict_loader(yaml):
    """The safe loader (the C one when built; never the unsafe one) refusing duplicate keys,
    which plain YAML loading resolves silently by keeping the last."""
    global _LOADER
    if _LOADER is None:
        base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

        class StrictSafeLoader(base):
            def construct_mapping(self, node, deep=False):
                seen: dict = {}
                for key_node, _ in node.value:
                    try:
                        key = self.construct_object(key_node, deep=True)
                        first = seen.setdefault(key, key_node.start_mark.line)
                    except TypeError:  # an unhashable key: the base class reports it
                        continue
                    if first != key_node.start_mark.line:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} at line {key_node.start_mark.line + 1} (first at line {first + 1})", key_node.start_mark
                        )
                return super().construct_mapping(node, deep)

        _LOADER = StrictSafeLoader
    return _LOADER


# The most bytes a file of the pack may have (fix.yaml, a change file, a profile): the largest
# change in the pack is under 10 KB; this bound keeps a damaged or hostile pack from making
# fixpack read, hash and parse hundreds of MB (checked by size before the file is read).
MAX_PACK_FILE = 1 << 20


def check_size(path: Path) -> None:
    """ConfigError naming ``path`` when it is larger than a pack file may be."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # reading it reports what is wrong
    if size > MAX_PACK_FILE:
        raise ConfigError(f"{path}: {size} bytes; a pack file may have at most {MAX_PACK_FILE} ({MAX_PACK_FILE >> 20} MiB); nothing was read")


def load_yaml(path: Path) -> Any:
    import yaml

    check_size(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml.load(raw, Loader=_strict_loader(yaml))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0] if str(exc) else exc}") from exc


def check_mapping(data: Any, schema: dict, *, where: str) -> dict:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, found {type(data).__name__}")
    for key in data:
        if key not in schema:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(schema)})")
    for key, (types, required, desc) in schema.items():
        if key not in data:
            if required:
                raise ConfigError(f"{where}: missing key {key!r} ({desc})")
            continue
        value = data[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool) and int in types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ConfigError(f"{where}: key {key!r} must be {names}, found {type(value).__name__}")
    return data


def check_slug(value: str, *, where: str) -> str:
    if not isinstance(value, str) or not SLUG.match(value):
        raise ConfigError(f"{where}: {value!r} is not a valid id (lowercase letters, digits, '.', '_', '-'; starting with a letter or digit)")
    return value
