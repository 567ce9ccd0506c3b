"""The lock: pinned hashes of every state an image can reach, generated from release sources.

profiles/<profile>.lock.json:
  pristine:   {rel: sha256} for every file any fix of the profile or its ports touches
  fixes:      {id: {layer, hash, earlier?}}  the hash of each fix's own files (fix.yaml and the
              profile's change file) when the lock was made; ``earlier``: hashes the fix had in
              a previous lock whose pinned files it still gives unchanged, so that an image
              applied then is still recognised as this state (carry_earlier)
  selections: [{key, port, opt_in, steps: [{fix, files: {rel: [before, after]}}]}]
  definitions: {fix: {sha256: {qualname: [first, last]}}}  where each edit or codemod found the
              definitions it names in the texts it was pinned on (fixpack.kinds.edit.locate)
"""

from __future__ import annotations

import json
from pathlib import Path

from fixpack.errors import ConfigError

LOCK_FORMAT = 1


def selection_key(port: str | None, opt_ins: list[str]) -> str:
    return f"{port or '-'}|{'+'.join(opt_ins)}"


def _pins_by_fix(data: dict) -> dict[str, list]:
    out: dict[str, list] = {}
    for sel in data.get("selections", []):
        for step in sel.get("steps", []):
            out.setdefault(step["fix"], []).append((sel.get("key"), step.get("files")))
    return out


def carry_earlier(previous: dict | None, new: dict) -> None:
    """Give each fix of ``new`` the hashes it had in ``previous`` (the lock being replaced)
    when every file it pins, in every selection, is unchanged: only its description or the
    layout of its folder moved, so an image whose state record names the earlier hash is at
    exactly the state the new lock pins. A fix whose pins changed keeps no earlier hash (an
    image applied with it is re-applied)."""
    if not isinstance(previous, dict) or previous.get("format") != LOCK_FORMAT:
        return
    old_pins, new_pins = _pins_by_fix(previous), _pins_by_fix(new)
    for fid, entry in new.get("fixes", {}).items():
        old = previous.get("fixes", {}).get(fid)
        if not isinstance(old, dict) or old_pins.get(fid) != new_pins.get(fid) or old.get("layer") != entry.get("layer"):
            continue
        earlier = set(old.get("earlier") or ()) | ({old["hash"]} if old.get("hash") else set())
        earlier.discard(entry["hash"])
        if earlier:
            entry["earlier"] = sorted(earlier)


class Lock:
    # a plain class: dataclasses pulls in inspect, too slow for the container-start path
    def __init__(self, path: Path, data: dict):
        self.path = path
        self.data = data

    @classmethod
    def load(cls, path: Path) -> Lock:
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no lock; generate it with `fixpack lock --profile {path.name.split('.lock')[0]}`") from None
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc}); regenerate it with `fixpack lock`") from exc
        if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT:
            raise ConfigError(f"{path}: unknown lock format; regenerate it with `fixpack lock`")
        return cls(path, data)

    @property
    def pristine(self) -> dict[str, str]:
        return self.data["pristine"]

    def selection(self, key: str) -> dict:
        for s in self.data["selections"]:
            if s["key"] == key:
                return s
        known = ", ".join(s["key"] for s in self.data["selections"])
        raise ConfigError(f"{self.path}: selection {key!r} is not pinned (pinned: {known}); run `fixpack lock`")

    def known_states(self, rel: str) -> dict[str, str]:
        """Every pinned hash of one file, with a description of the state it is."""
        out = {}
        if rel in self.pristine:
            out[self.pristine[rel]] = "pristine"
        for s in self.data["selections"]:
            for step in s["steps"]:
                pair = step["files"].get(rel)
                if pair and pair[1] not in out:
                    out[pair[1]] = f"after {step['fix']} (selection {s['key']})"
        return out
