"""fixes: the fix pack's device gates, each run as `python device_gate.py` (its exit code is its
result, its last line of output its figures).

They live beside what they decide: `fixes/<id>/device_gate.py` and
`ports/<port>/fixes/<id>/device_gate.py` for a fix, `gates/<name>/device_gate.py` for a defect
that no fix answers yet (the card decides whether one is needed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .client import Client, GateError, Result, run_script

PATTERNS = ("fixes/*/device_gate.py", "ports/*/fixes/*/device_gate.py", "gates/*/device_gate.py")


def device_gates(pack_root: Path) -> list[Path]:
    found = []
    for pattern in PATTERNS:
        found += sorted(pack_root.glob(pattern))
    return found


def gate_fix_scripts(client: Client | None, opts) -> list[Result]:
    scripts = device_gates(opts.pack_root)
    if not scripts:
        return [Result("fixes", "missing", f"no device_gate.py under {opts.pack_root} ({', '.join(PATTERNS)})")]
    model = ""
    if client is not None:
        try:
            model = client.model
        except GateError:
            pass  # no server: scripts that need none still run
    env = dict(os.environ, GATE_BASE_URL=client.base if client else opts.base_url, GATE_MODEL=model)
    out = []
    for s in scripts:
        result, figures, details = run_script([sys.executable, str(s)], opts.script_timeout, env=env, cwd=s.parent)
        out.append(Result(f"fix:{s.parent.name}", result, figures, details))
    return out
