"""Device gate: the card semantics the emulation models, checked once on a Gaudi card.

Each check runs one rule on ``hpu`` and compares what the card does with what the emulation does
(the fidelity table of ``emulation/README.md`` names each rule, what it follows and the check here):

Inferred from vllm-gaudi's design (device.py; it pads with -1 and keeps a spare last row):
1. ``index_select`` with index -1 reads the last row;
2. ``embedding`` with id -1 reads the last row;
3. ``index_copy_`` with index -1 writes the last row;
4. ``index_reduce_`` with index -1 reduces into the last row;
5. ``one_hot`` of a class outside [0, num_classes) is an all-zero row.
What a card refuses (refusals.py; Intel's bridge source and support matrix):
6. ``mixed_devices``: an op on a card tensor and a 2-D host tensor raises in eager mode
   (PT_HPU_LAZY_MODE=0: "Expected all tensors to be on the HPU device"); in lazy mode the bridge
   copies the host tensor and the sum is right (outside a captured HPU graph; the emulation refuses
   it inside one, which this gate does not check);
7. ``mixed_devices_allowed``: a 0-dim host tensor in a card op, host indices and host values in a
   card tensor's indexing, all give the host's result;
8. ``host_tensor_list``: ``torch.cat`` of a card and a host tensor raises in eager mode;
9. ``complex``: a complex64 tensor moved to the card raises "Complex datatype is not supported";
10. ``float64``: a float64 tensor on the card keeps float32 precision (1 + 2**-30 reads back as 1),
    the bridge's silent cast the emulation refuses instead;
How the card reads and writes FP8 (kernels/fp8.py):
11. ``e4m3fn_read``: every one of the 256 float8_e4m3fn codes read on the card (``.float()``): on
    Gaudi 2 the 16 codes of the top exponent are +-inf (mantissa 000) or NaN, 240 the largest
    finite value; on Gaudi 3 OCP E4M3 (448, NaN only at 0x7f / 0xff);
12. ``e4m3fn_bytes_to_host``: the same codes moved to the host and read there are PyTorch's
    float8_e4m3fn values on both cards (vllm-gaudi's per_tensor_dequantize);
13. ``e4m3fn_halved_read``: Gaudi 2's handling (gaudi_weight_wrapper: halved in float8_e4m3fn,
    scale doubled) reads back exactly for the 448 range;
14. ``cast_to_fp8_saturates``: ``cast_to_fp8_v2`` of 300 and -1000 gives +-240 on Gaudi 2 and
    300 / -448 on Gaudi 3 (the emulation's assumed saturation).
Checks 1-5 were inferred, 6-14 follow the sources named in the table; none has been measured on a
card: this gate has never been run on one (the project's machines have no Gaudi). It prints one
JSON line last.

    python3 emulation/device_gate.py            # on a Gaudi card (Intel's habana_frameworks)
    python3 emulation/device_gate.py --emulated # on the emulation: checks this script's logic only

Exit 0: every rule holds on this device; 1: one does not (the emulation is wrong there and must
change); 2: no card (and not --emulated): nothing was checked.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

RAISES = object()  # the expectation "this call raises" (with ``match`` in its message)


def _e4m3fn(code: int, gaudi2: bool) -> float:
    """E4M3 with bias 7, decoded from the bits: OCP, or IEEE-754 special values on Gaudi 2."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and (gaudi2 or man == 0x7):
        return sign * math.inf if gaudi2 and man == 0 else math.nan
    if exp == 0:
        return sign * man / 8 * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def checks(gaudi2: bool, lazy: bool, emulated: bool = False):
    """name -> (call(device), expected): a tensor to compare with, or (RAISES, match). ``emulated``:
    the expectations where the emulation is deliberately stricter than the card (float64)."""
    import torch

    table = torch.arange(12.0).view(4, 3)
    source = torch.full((2, 3), 7.0)
    want_copy = table.clone()
    want_copy[0], want_copy[3] = 7.0, 7.0
    want_reduce = table.clone()
    want_reduce[0] = torch.maximum(table[0], source[0])
    want_reduce[3] = torch.maximum(table[3], source[1])
    idx = torch.tensor([0, -1])
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = torch.tensor([math.isfinite(_e4m3fn(c, False)) for c in range(256)])
    raw = codes[finite]
    half = (raw.float() * 0.5).to(torch.float8_e4m3fn)
    exact_half = (raw.float() * 0.5) == half.float()  # all but the 16 smallest codes with an odd mantissa

    def mixed_allowed(dev):
        t = table.to(dev)
        a = (t * torch.tensor(2.0)).cpu()
        b = t[torch.tensor([3, 0])].cpu()
        t[torch.tensor([1])] = torch.full((1, 3), -1.0)
        return torch.cat([a, b, t.cpu()])

    def halved(dev):
        return (half.to(dev).float() * torch.tensor(2.0).to(dev)).cpu()[exact_half]

    def saturate(dev):
        x = torch.tensor([300.0, -1000.0]).to(dev)
        return torch.ops.hpu.cast_to_fp8_v2(x, None, False, False, torch.float8_e4m3fn)[0].cpu().float()

    cases = {
        "index_select": (lambda d: table.to(d).index_select(0, idx.to(d)), table[[0, 3]]),
        "embedding": (lambda d: torch.nn.functional.embedding(idx.to(d), table.to(d)), table[[0, 3]]),
        "index_copy_": (lambda d: table.to(d).clone().index_copy_(0, idx.to(d), source.to(d)), want_copy),
        "index_reduce_": (lambda d: table.to(d).clone().index_reduce_(0, idx.to(d), source.to(d), "amax"), want_reduce),
        "one_hot": (
            lambda d: torch.nn.functional.one_hot(torch.tensor([0, 2, 3, -1], device=d), 3),
            torch.tensor([[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]]),
        ),
        "mixed_devices": (
            lambda d: table.to(d) + torch.ones(4, 3),
            table + 1 if lazy else (RAISES, "device"),
        ),
        "mixed_devices_allowed": (
            mixed_allowed,
            torch.cat([table * 2, table[[3, 0]], torch.cat([table[:1], torch.full((1, 3), -1.0), table[2:]])]),
        ),
        "host_tensor_list": (
            lambda d: torch.cat([table.to(d), torch.ones(1, 3)]),
            torch.cat([table, torch.ones(1, 3)]) if lazy else (RAISES, "device"),
        ),
        "complex": (lambda d: torch.ones(2, dtype=torch.complex64).to(d) * 2, (RAISES, "Complex datatype")),
        "float64": (
            lambda d: torch.tensor([1 + 2**-30], dtype=torch.float64).to(d).cpu() - 1,
            (RAISES, "float64 on hpu") if emulated else torch.tensor([0.0], dtype=torch.float64),
        ),
        "e4m3fn_read": (
            lambda d: codes.to(d).float().cpu(),
            torch.tensor([_e4m3fn(c, gaudi2) for c in range(256)], dtype=torch.float32),
        ),
        "e4m3fn_bytes_to_host": (lambda d: codes.to(d).to("cpu").float(), codes.float()),
        "e4m3fn_halved_read": (halved, raw.float()[exact_half]),
        "cast_to_fp8_saturates": (
            saturate,
            torch.tensor([240.0, -240.0]) if gaudi2 else torch.tensor([288.0, -448.0]),
        ),
    }
    return cases


def run(device: str = "hpu", gaudi2: bool | None = None, lazy: bool | None = None, emulated: bool = False) -> dict:
    if gaudi2 is None:
        gaudi2 = _is_gaudi2()
    if lazy is None:
        lazy = os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"
    results = {}
    for name, (fn, want) in checks(gaudi2, lazy, emulated).items():
        try:
            got = fn(device).to("cpu")
        except Exception as exc:  # a raise is a failed assumption, unless a raise is what is expected
            if isinstance(want, tuple) and want[0] is RAISES:
                results[name] = want[1] in str(exc) or f"raised without {want[1]!r}: {exc}"
            else:
                results[name] = f"raised {type(exc).__name__}: {exc}"
            continue
        if isinstance(want, tuple) and want[0] is RAISES:
            results[name] = f"did not raise (expected a message with {want[1]!r})"
        else:
            results[name] = bool(torch_equal(got, want))
    return results


def _is_gaudi2() -> bool:
    import habana_frameworks.torch.utils.experimental as htexp

    return htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi2


def torch_equal(a, b) -> bool:
    """Equal shapes and values, a NaN equal to a NaN."""
    import torch

    if a.shape != b.shape:
        return False
    a, b = a.to(b.dtype), b
    if b.is_floating_point():
        return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))
    return bool(torch.equal(a, b))


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
    lazy = os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"
    results = run(lazy=lazy, emulated=emulated)
    ok = all(v is True for v in results.values())
    where = "emulation (not a device result)" if emulated else "card"
    card = "gaudi2" if _is_gaudi2() else "gaudi3"
    print(
        json.dumps({"gate": "hpu-semantics", "on": where, "card": card, "lazy": lazy, "passed": ok, "results": results})
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
