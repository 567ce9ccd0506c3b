"""The records the engine keeps beside the targets: applied steps, the state record and the journal.

Each is a dataclass read from and written to JSON (fixpack.store checks the shape before one is
built; a record that fails the check reads as `Unreadable`). The JSON keys are those of earlier
versions, so an image applied by one reads with the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from fixpack.locations import layer_port, port_layer


@dataclass(frozen=True)
class Layer:
    """Where a fix comes from: the profile (``port`` None) or a port's patches."""

    port: str | None = None

    @classmethod
    def parse(cls, text: str) -> Layer:
        return cls(layer_port(text))

    def __str__(self) -> str:
        return port_layer(self.port)


PROFILE = Layer()


@dataclass
class Step:
    """One applied fix: the hash of each target file before and after it."""

    fix: str
    files: dict[str, list[str]]  # rel -> [before, after] (sha256)
    layer: Layer = PROFILE
    fix_hash: str | None = None
    dir: str | None = None  # pack-relative folder of a fix outside fixes/ (a profile's own folder)
    sandbox: str | None = None  # what confined the fix's process

    def after(self) -> dict[str, str]:
        return {rel: pair[1] for rel, pair in self.files.items()}

    @classmethod
    def from_json(cls, d: dict) -> Step:
        return cls(
            fix=d["fix"],
            files={rel: list(pair) for rel, pair in d["files"].items()},
            layer=Layer.parse(d.get("layer") or "profile"),
            fix_hash=d.get("fix_hash"),
            dir=d.get("dir"),
            sandbox=d.get("sandbox"),
        )

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "fix": self.fix,
            "layer": str(self.layer),
            "fix_hash": self.fix_hash,
            "files": self.files,
        }
        if self.dir:
            out["dir"] = self.dir
        if self.sandbox:
            out["sandbox"] = self.sandbox
        return out


def expected_after(steps: list[Step]) -> dict[str, str]:
    """Each file's hash after the last of ``steps`` that touches it."""
    exp: dict[str, str] = {}
    for s in steps:
        exp.update(s.after())
    return exp


# The record's own keys; anything else read from a file is kept as it was.
_STATE_KEYS = (
    "profile",
    "port",
    "opt_in",
    "key",
    "tool_version",
    "packages",
    "base",
    "protection",
    "format",
    "updated",
)


@dataclass
class StateRecord:
    """What is applied (state.json): the selection, where its packages are, and its steps."""

    steps: list[Step] = field(default_factory=list)
    profile: str | None = None
    port: str | None = None
    opt_in: list[str] | None = None
    key: str | None = None
    tool_version: str | None = None
    packages: dict[str, str] | None = None
    base: dict | None = None
    protection: dict | None = None
    format: int | None = None
    updated: str | None = None
    extra: dict = field(default_factory=dict)

    def with_steps(self, steps: list[Step]) -> StateRecord:
        return replace(self, steps=list(steps))

    @classmethod
    def from_json(cls, d: dict) -> StateRecord:
        return cls(
            steps=[Step.from_json(s) for s in d.get("steps", [])],
            **{k: d[k] for k in _STATE_KEYS if k in d},
            extra={k: v for k, v in d.items() if k not in _STATE_KEYS and k != "steps"},
        )

    def to_json(self, *, steps: bool = True) -> dict:
        out = dict(self.extra)
        out.update({k: getattr(self, k) for k in _STATE_KEYS if getattr(self, k) is not None})
        if steps:
            out["steps"] = [s.to_json() for s in self.steps]
        return out


@dataclass
class Journal:
    """A fix being committed (journal.json): enough to finish or undo it after a crash."""

    op: str  # "apply" or "unwind"
    step: Step
    files: dict[str, list[str]]  # rel -> [before, after] of this commit
    state_base: StateRecord  # the state record to write, less its steps
    steps_before: list[Step]

    @classmethod
    def from_json(cls, d: dict) -> Journal:
        return cls(
            op=d["op"],
            step=Step.from_json(d["step"]),
            files={rel: list(pair) for rel, pair in d["files"].items()},
            state_base=StateRecord.from_json({k: v for k, v in d["state_base"].items() if k != "steps"}),
            steps_before=[Step.from_json(s) for s in d["steps_before"]],
        )

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "step": self.step.to_json(),
            "files": self.files,
            "state_base": self.state_base.to_json(steps=False),
            "steps_before": [s.to_json() for s in self.steps_before],
        }


@dataclass(frozen=True)
class Unreadable:
    """A state record or journal that exists but cannot be used (not JSON, or not its shape)."""

    why: str
