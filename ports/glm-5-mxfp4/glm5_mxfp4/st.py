"""safetensors files without holding them in memory.

A file is an 8-byte little-endian header length N, N bytes of JSON (name -> dtype, shape,
data_offsets [begin, end) relative to the end of the header; optional "__metadata__"), then the
data. The reader parses the header and reads byte ranges; the writer is given every tensor's
name, dtype and shape up front (the converter knows them from the input headers), writes the
header first and then the data tensor by tensor, in the order given.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

DTYPE_SIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
MAX_HEADER = 100 * 1024 * 1024  # the reference implementation refuses larger headers


class FormatError(ValueError):
    pass


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    path: str
    size: int
    raw: bytes  # the header bytes (for fingerprints)
    entries: dict[str, Entry]
    metadata: dict


def read_header(path: str) -> Header:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise FormatError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise FormatError(f"{path}: header length {n} does not fit the file ({size} bytes)")
        raw = f.read(n)
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise FormatError(f"{path}: the header is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{path}: the header is not a JSON object")
    base = 8 + n
    metadata = obj.pop("__metadata__", None) or {}
    entries = {}
    for name, spec in obj.items():
        try:
            dtype, shape, (b, e) = spec["dtype"], tuple(int(d) for d in spec["shape"]), spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{path}: tensor {name}: malformed header entry {spec!r}") from None
        if dtype not in DTYPE_SIZE:
            raise FormatError(f"{path}: tensor {name}: unknown dtype {dtype}")
        count = 1
        for d in shape:
            count *= d
        if not (0 <= b <= e and base + e <= size and e - b == count * DTYPE_SIZE[dtype]):
            raise FormatError(
                f"{path}: tensor {name}: data_offsets {[b, e]} do not match "
                f"{dtype}{list(shape)} within a {size}-byte file"
            )
        entries[name] = Entry(name, dtype, shape, base + b, base + e)
    return Header(path, size, raw, entries, metadata)


@dataclass(frozen=True)
class OutSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count * DTYPE_SIZE[self.dtype]


def build_header(specs: list[OutSpec], metadata: dict | None = None) -> bytes:
    """Header bytes (length prefix included) for tensors laid out in the order given."""
    obj: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for s in specs:
        obj[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(text)) + text


def data_size(specs: list[OutSpec]) -> int:
    return sum(s.nbytes for s in specs)
