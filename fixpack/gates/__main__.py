"""python3 -m fixpack.gates --port NAME [--pack DIR] [gate options...]: the device gates a port
declares in its port.yaml (``gates.module``, importable from ``gates.path``), run by the one
runner (fixpack/gates/runner.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fixpack.gates import runner


def port_gates(pack: Path, port: str):
    """The gate module ``ports/<port>/port.yaml`` declares."""
    import yaml

    from fixpack.pack.ports import import_module_from

    path = pack / "ports" / port / "port.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    gates = data.get("gates") if isinstance(data, dict) else None
    if (
        not isinstance(gates, dict)
        or not isinstance(gates.get("module"), str)
        or not isinstance(gates.get("path"), str)
    ):
        raise SystemExit(f"gates: {path}: no 'gates' section with 'module' and 'path'")
    return import_module_from(gates["module"], pack / gates["path"])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the repository: $COOKBOOK in a port image (fixpack is installed there), else this checkout
    pack, port = Path(os.environ.get("COOKBOOK") or Path(__file__).resolve().parents[2]), None
    rest = []
    while argv:
        a = argv.pop(0)
        if a in ("--port", "--pack") and argv:
            value = argv.pop(0)
            if a == "--port":
                port = value
            else:
                pack = Path(value)
        else:
            rest.append(a)
    if port is None:
        print("usage: python3 -m fixpack.gates --port NAME [--pack DIR] [gate options...]", file=sys.stderr)
        return 2
    return runner.main(port_gates(pack, port), rest, prog=f"python3 -m fixpack.gates --port {port}")


if __name__ == "__main__":
    raise SystemExit(main())
