"""The lock: pinned hashes of every state an image can reach, generated from release sources.

profiles/<profile>.lock.json:
  pristine:   {rel: sha256} for every file any fix of the profile or its ports touches
  fixes:      {id: {layer, hash}}  the hash of each fix's own files when the lock was made
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
