"""Device gate: the card semantics the emulation assumes, checked once on a Gaudi card.

vllm-gaudi pads with -1 and sizes its tables with a spare last row, and its runner relies on
``one_hot`` giving a zero row for an out-of-range class. The emulation assumes (device.py):
1. ``index_select`` with index -1 reads the last row;
2. ``embedding`` with id -1 reads the last row;
3. ``index_copy_`` with index -1 writes the last row;
4. ``index_reduce_`` with index -1 reduces into the last row;
5. ``one_hot`` of a class outside [0, num_classes) is an all-zero row.
These were inferred from vllm-gaudi's design, never measured on a card. This gate runs each on
``hpu`` and compares with the value the emulation gives; it prints one JSON line last.

    python3 emulation/device_gate.py            # on a Gaudi card (Intel's habana_frameworks)
    python3 emulation/device_gate.py --emulated # on the emulation: checks this script's logic only

Exit 0: every assumption holds on this device; 1: one does not (the emulation is wrong there and
must change); 2: no card (and not --emulated): nothing was checked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def checks():
    import torch

    table = torch.arange(12.0).view(4, 3)
    source = torch.full((2, 3), 7.0)
    want_copy = table.clone()
    want_copy[0], want_copy[3] = 7.0, 7.0
    want_reduce = table.clone()
    want_reduce[0] = torch.maximum(table[0], source[0])
    want_reduce[3] = torch.maximum(table[3], source[1])
    idx = torch.tensor([0, -1])
    return (
        {
            "index_select": (lambda t, i: t.index_select(0, i), table[[0, 3]]),
            "embedding": (lambda t, i: torch.nn.functional.embedding(i, t), table[[0, 3]]),
            "index_copy_": (lambda t, i: t.clone().index_copy_(0, i, source.to(t.device)), want_copy),
            "index_reduce_": (lambda t, i: t.clone().index_reduce_(0, i, source.to(t.device), "amax"), want_reduce),
            "one_hot": (
                lambda t, i: torch.nn.functional.one_hot(torch.tensor([0, 2, 3, -1], device=t.device), 3),
                torch.tensor([[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]]),
            ),
        },
        table,
        idx,
    )


def run(device: str = "hpu") -> dict:
    results = {}
    cases, table, idx = checks()
    for name, (fn, want) in cases.items():
        try:
            got = fn(table.to(device), idx.to(device)).cpu()
            results[name] = bool(torch_equal(got, want))
        except Exception as exc:  # a raise is a failed assumption too
            results[name] = f"raised {type(exc).__name__}: {exc}"
    return results


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.equal(a.to(b.dtype), b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emulated", action="store_true", help="run on the emulation (checks this script only)")
    args = ap.parse_args(argv)
    if args.emulated:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import hpu_emulation

        hpu_emulation.activate()
    try:
        import habana_frameworks.torch  # noqa: F401
    except ImportError:
        print(json.dumps({"gate": "hpu-semantics", "result": "no card", "checked": False}))
        return 2
    emulated = bool(getattr(sys.modules.get("habana_frameworks"), "__hpu_emulation__", False))
    if emulated and not args.emulated:
        print(json.dumps({"gate": "hpu-semantics", "result": "the emulation, not a card", "checked": False}))
        return 2
    results = run()
    ok = all(v is True for v in results.values())
    where = "emulation (not a device result)" if emulated else "card"
    print(json.dumps({"gate": "hpu-semantics", "on": where, "passed": ok, "results": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
