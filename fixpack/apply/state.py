"""The records the engine keeps beside the targets: applied steps, the state record and the journal.

Each is a record class read from and written to JSON (fixpack.apply.store checks the shape before one
is built; a record that fails the check reads as `Unreadable`). The JSON keys are those of
earlier versions, so an image applied by one reads with the next.

They are plain classes with __slots__, not @dataclass: `fixpack verify` reads the state record
at every container start (goal: 3x the interpreter's start-up), and `import dataclasses` pulls
in `inspect`, about 10 ms here, a third of that start-up.
"""

from __future__ import annotations

from fixpack.apply.locations import layer_port, port_layer


class _Record:
    """Equality and repr over the slots, as a dataclass has them."""

    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Record) and type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *map(repr, self._values())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


class Layer(_Record):
    """Where a fix comes from: the profile (``port`` None) or a port's patches."""

    __slots__ = ("port",)

    def __init__(self, port: str | None = None):
        self.port = port

    @classmethod
    def parse(cls, text: str) -> Layer:
        return cls(layer_port(text))

    def __str__(self) -> str:
        return port_layer(self.port)


PROFILE = Layer()


class Step(_Record):
    """One applied fix: the hash of each target file before and after it."""

    __slots__ = ("fix", "files", "layer", "fix_hash", "dir", "sandbox")

    def __init__(
        self,
        fix: str,
        files: dict[str, list[str]],  # rel -> [before, after] (sha256)
        layer: Layer = PROFILE,
        fix_hash: str | None = None,
        dir: str | None = None,  # pack-relative folder of a fix outside fixes/ (a profile's own folder)
        sandbox: str | None = None,  # what confined the fix's process
    ):
        self.fix = fix
        self.files = files
        self.layer = layer
        self.fix_hash = fix_hash
        self.dir = dir
        self.sandbox = sandbox

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
        out: dict = {
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


def selection_pins(lock, key: str | None) -> dict[str, dict[str, list[str]]] | None:
    """fix -> {rel: [before, after]} that ``lock`` pins for selection ``key`` (None: not pinned)."""
    sel = next((s for s in lock.data.get("selections", []) if s.get("key") == key), None)
    return None if sel is None else {p["fix"]: p["files"] for p in sel["steps"]}


def unpinned(lock, key: str | None, pins: dict | None, step: Step) -> str | None:
    """Why ``step`` is not a step ``lock`` pins for selection ``key`` (None: it is): the same
    fix, the same files, the same hashes before and after."""
    from fixpack.apply.hashing import short

    if pins is None:
        return f"records selection {key!r}, which {lock.path.name} does not pin"
    want = pins.get(step.fix)
    if want is None:
        return f"records fix {step.fix}, which {lock.path.name} does not pin for selection {key}"
    for rel in sorted(set(step.files) | set(want)):
        got, exp = step.files.get(rel), want.get(rel)
        if got is None or exp is None or list(got) != list(exp):
            return (
                f"fix {step.fix} records {rel} as {'nothing' if got is None else short(got[0]) + ' -> ' + short(got[1])}, "
                f"but {lock.path.name} pins {'nothing' if exp is None else short(exp[0]) + ' -> ' + short(exp[1])} for selection {key}"
            )
    return None


def pinned_steps(lock, key: str | None, steps: list[Step], record) -> dict[str, dict[str, list[str]]]:
    """Check that every one of ``steps`` (read from ``record``, a state record or a journal) is
    a step ``lock`` pins for selection ``key``. A record is trusted only that far: one the lock
    does not pin (planted, or stale) would make fixpack skip, recover or restore bytes it never
    checked. Raises Drift naming the record and the file; returns the selection's pins by fix."""
    from fixpack.errors import Drift

    pins = selection_pins(lock, key)
    whys = (
        [unpinned(lock, key, pins, s) for s in steps]
        if pins is not None
        else [f"records selection {key!r}, which {lock.path.name} does not pin"]
    )
    for why in whys:
        if why:
            raise Drift(
                f"{record}: {why}; the record is not trusted and nothing was changed. "
                "Run `fixpack verify`; revert with the pack that applied it, or reinstall the package"
            )
    return pins or {}


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


class StateRecord(_Record):
    """What is applied (state.json): the selection, where its packages are, and its steps."""

    __slots__ = ("steps", *_STATE_KEYS, "extra")

    def __init__(
        self,
        steps: list[Step] | None = None,
        profile: str | None = None,
        port: str | None = None,
        opt_in: list[str] | None = None,
        key: str | None = None,
        tool_version: str | None = None,
        packages: dict[str, str] | None = None,
        base: dict | None = None,
        protection: dict | None = None,
        format: int | None = None,
        updated: str | None = None,
        extra: dict | None = None,
    ):
        self.steps: list[Step] = list(steps or [])
        self.profile = profile
        self.port = port
        self.opt_in = opt_in
        self.key = key
        self.tool_version = tool_version
        self.packages = packages
        self.base = base
        self.protection = protection
        self.format = format
        self.updated = updated
        self.extra: dict = dict(extra or {})

    def with_steps(self, steps: list[Step]) -> StateRecord:
        """The same record holding ``steps``."""
        return StateRecord(steps, **{k: getattr(self, k) for k in _STATE_KEYS}, extra=self.extra)

    @classmethod
    def from_json(cls, d: dict) -> StateRecord:
        return cls(
            [Step.from_json(s) for s in d.get("steps", [])],
            **{k: d[k] for k in _STATE_KEYS if k in d},
            extra={k: v for k, v in d.items() if k not in _STATE_KEYS and k != "steps"},
        )

    def to_json(self, *, steps: bool = True) -> dict:
        out = dict(self.extra)
        out.update({k: getattr(self, k) for k in _STATE_KEYS if getattr(self, k) is not None})
        if steps:
            out["steps"] = [s.to_json() for s in self.steps]
        return out


class Journal(_Record):
    """A fix being committed (journal.json): enough to finish or undo it after a crash."""

    __slots__ = ("op", "step", "files", "state_base", "steps_before")

    def __init__(
        self,
        op: str,  # "apply" or "unwind"
        step: Step,
        files: dict[str, list[str]],  # rel -> [before, after] of this commit
        state_base: StateRecord,  # the state record to write, less its steps
        steps_before: list[Step],
    ):
        self.op = op
        self.step = step
        self.files = files
        self.state_base = state_base
        self.steps_before = steps_before

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


class Unreadable(_Record):
    """A state record or journal that exists but cannot be used (not JSON, or not its shape)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why
