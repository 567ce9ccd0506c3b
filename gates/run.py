#!/usr/bin/env python3
"""Run the fix pack's device gates on a Gaudi card: one command, no server needed.

    python3 gates/run.py [--only NAME,...] [--json PATH] [--timeout S] [--list]

A device gate is a `device_gate.py` beside what it decides: `fixes/<id>/` and
`ports/<port>/fixes/<id>/` for a fix whose defect shows only on a card, `gates/<name>/` for a
defect no fix answers yet. Each runs as `python device_gate.py` in its folder, in the image
with the pack applied; exit code 0 is pass, its last line of output is its figures. The exit
code here is 1 when any gate fails, else 0. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATTERNS = ("fixes/*/device_gate.py", "ports/*/fixes/*/device_gate.py", "gates/*/device_gate.py")


def device_gates(root: Path = ROOT) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pattern in PATTERNS:
        for p in sorted(root.glob(pattern)):
            out.setdefault(p.parent.name, p)
    return out


def run_one(path: Path, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout, cwd=path.parent)
    except subprocess.TimeoutExpired:
        return {"result": "fail", "figures": f"timed out after {timeout:g} s", "rc": None, "seconds": round(time.perf_counter() - t0, 1)}
    tail = [l for l in (proc.stdout + "\n" + proc.stderr).strip().splitlines() if l.strip()]
    return {
        "result": "pass" if proc.returncode == 0 else "fail",
        "figures": tail[-1][:200] if tail else "",
        "rc": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "output_tail": tail[-20:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated gate names (the folder names)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per gate")
    ap.add_argument("--list", action="store_true", help="list the gates and exit")
    a = ap.parse_args(argv)
    gates = device_gates()
    if a.list:
        for name, path in gates.items():
            print(f"{name:<28} {path.relative_to(ROOT)}")
        return 0
    names = [n.strip() for n in a.only.split(",")] if a.only else list(gates)
    unknown = [n for n in names if n not in gates]
    if unknown:
        print(f"gates/run.py: unknown gate(s) {', '.join(unknown)}; known: {', '.join(gates)}", file=sys.stderr)
        return 2
    results = {}
    for name in names:
        results[name] = r = run_one(gates[name], a.timeout)
        print(f"{name:<28} {r['result']:<5} {r['seconds']:7.1f}s  {r['figures']}", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"gates": results}, indent=1) + "\n")
    return 1 if any(r["result"] != "pass" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
