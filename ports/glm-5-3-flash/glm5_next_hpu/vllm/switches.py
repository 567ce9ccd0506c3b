"""The plugin's five environment switches, with the served defaults (port.yaml ``switches``).

Read once at model construction. Every value is validated: a typo stops the engine with a
message naming the variable instead of silently selecting another path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: name -> (default, kind, extra). Mirrors ports/glm-5-3-flash/port.yaml `switches` (a test checks it).
SPEC: dict[str, tuple[object, str, dict]] = {
    "GLM5_NEXT_VISION": (1, "bool", {}),
    "GLM5_NEXT_IMAGE_MAX_TOKENS": (2048, "int", {"min": 1}),
    "GLM5_NEXT_KDA_SCAN": (1, "bool", {"reference": 0}),
    "GLM5_NEXT_DECODE_LAYER_GROUP": (45, "int", {"min": 1, "max": 45, "reference": 1}),
    "GLM5_NEXT_MHC_SINKHORN": ("kernel", "choice", {"choices": ("kernel", "torch"), "reference": "torch"}),
}


class SwitchError(ValueError):
    pass


@dataclass(frozen=True)
class Switches:
    vision: bool
    image_max_tokens: int
    kda_scan: bool
    decode_layer_group: int
    mhc_sinkhorn: str

    @property
    def reference_path(self) -> bool:
        return not self.kda_scan and self.decode_layer_group == 1 and self.mhc_sinkhorn == "torch"


def _parse(name: str, env) -> object:
    default, kind, extra = SPEC[name]
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    raw = raw.strip()
    if kind == "bool":
        if raw.lower() in ("1", "true", "yes", "on"):
            return 1
        if raw.lower() in ("0", "false", "no", "off"):
            return 0
        raise SwitchError(f"{name}={raw!r}: expected 0 or 1")
    if kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise SwitchError(f"{name}={raw!r}: expected an integer") from None
        if value < extra.get("min", value) or value > extra.get("max", value):
            raise SwitchError(f"{name}={value}: expected {extra.get('min')}..{extra.get('max', 'inf')}")
        return value
    if raw not in extra["choices"]:
        raise SwitchError(f"{name}={raw!r}: expected one of {', '.join(extra['choices'])}")
    return raw


def read_switches(env=None) -> Switches:
    env = os.environ if env is None else env
    return Switches(
        vision=bool(_parse("GLM5_NEXT_VISION", env)),
        image_max_tokens=int(_parse("GLM5_NEXT_IMAGE_MAX_TOKENS", env)),
        kda_scan=bool(_parse("GLM5_NEXT_KDA_SCAN", env)),
        decode_layer_group=int(_parse("GLM5_NEXT_DECODE_LAYER_GROUP", env)),
        mhc_sinkhorn=str(_parse("GLM5_NEXT_MHC_SINKHORN", env)),
    )
