"""One work unit: read the source tensors, quantize the routed experts, stream one output file.

Three stages overlap: the caller's thread reads (O_DIRECT where possible, into a buffer from a
fixed pool, hashing as it goes), a thread quantizes (the numba kernel releases the GIL and uses
every core), a thread writes (hashing and fdatasync-ing as it goes). An item is one routed-expert tensor or a chunk of
at most CHUNK bytes of a copied tensor; the pools' buffers are recycled, so a worker holds
IN_SLOTS + OUT_SLOTS buffers however large the tensors of the source are.
"""

from __future__ import annotations

import os
import queue
import threading

import blake3
import numpy as np

from . import mxfp4, st
from .output import crashpoint, fsync_dir, tmp_name
from .source import InputError, Source, Tensor

CHUNK = 32 << 20
SYNC_EVERY = 512 << 20
DEPTH = 3
IN_SLOTS = 2 * DEPTH  # read buffers, recycled: fresh allocations would fault in (and zero) every page
OUT_SLOTS = DEPTH + 1
_END = object()


ALIGN = 4096


def aligned_buffer(size: int) -> np.ndarray:
    """A uint8 buffer whose address is a multiple of ALIGN, with room to read whole aligned blocks."""
    raw = np.empty(size + 3 * ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGN
    return raw[skip:skip + size + 2 * ALIGN]


class SourceReader:
    """Reads byte ranges of one source file with O_DIRECT where the file system allows it: the disk
    writes straight into our buffer, with no page-cache copy to pay for in CPU time (the converter
    is CPU-bound on small machines). Falls back to plain pread (and says so in `direct`)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        try:
            self.dfd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0)) if hasattr(os, "O_DIRECT") else None
        except OSError:  # e.g. tmpfs
            self.dfd = None
        self.direct = self.dfd is not None

    def read(self, buf: np.ndarray, begin: int, n: int) -> np.ndarray:
        """Bytes [begin, begin + n) of the file, as a view into `buf` (from `aligned_buffer`)."""
        if self.dfd is not None:
            start = begin - begin % ALIGN
            skip = begin - start
            length = -(-(skip + n) // ALIGN) * ALIGN
            if length <= len(buf):
                got = 0
                mv = memoryview(buf)
                while got < skip + n:
                    if got % ALIGN:  # a short read left us unaligned: finish the plain way
                        _pread_into(self.fd, mv[got:skip + n], start + got)
                        break
                    r = os.preadv(self.dfd, [mv[got:length]], start + got)
                    if r <= 0:
                        raise OSError(f"{self.path}: short read at offset {start + got}")
                    got += r
                return buf[skip:skip + n]
        _pread_into(self.fd, memoryview(buf)[:n], begin)
        return buf[:n]

    def drop(self, begin: int, n: int) -> None:
        os.posix_fadvise(self.fd, begin, n, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        os.close(self.fd)
        if self.dfd is not None:
            os.close(self.dfd)


class _Pool:
    """A fixed set of equal buffers handed round the stages; `take` blocks until one is free."""

    def __init__(self, count: int, size: int, aligned: bool = False):
        self.free: queue.Queue = queue.Queue()
        for _ in range(count if size else 0):
            self.free.put(aligned_buffer(size) if aligned else np.empty(size, dtype=np.uint8))

    def take(self) -> np.ndarray:
        return self.free.get()

    def give(self, buf: np.ndarray) -> None:
        self.free.put(buf)


def out_specs(tensors: list[Tensor]) -> list[st.OutSpec]:
    specs = []
    for t in tensors:
        e = t.entry
        if t.quantized:
            *rows, k = e.shape
            specs.append(st.OutSpec(t.name, "U8", (*rows, k // 2)))
            specs.append(st.OutSpec(t.name + "_scale", "U8", (*rows, k // mxfp4.BLOCK)))
        else:
            specs.append(st.OutSpec(t.name, e.dtype, e.shape))
    return specs


def _pread_into(fd: int, buf: memoryview, offset: int) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n <= 0:
            raise OSError(f"short read at offset {offset + done}")
        done += n


class _Stage(threading.Thread):
    def __init__(self, fn, inq, outq, discard):
        super().__init__(daemon=True)
        self.fn, self.inq, self.outq, self.discard, self.error = fn, inq, outq, discard, None

    def run(self):
        try:
            while True:
                item = self.inq.get()
                if item is _END:
                    break
                self.fn(item)
        except BaseException as exc:  # handed to the reader, which stops feeding
            self.error = exc
            while (item := self.inq.get()) is not _END:  # drain so the producer never blocks,
                self.discard(item)  # handing the buffers back
        finally:
            if self.outq is not None:
                self.outq.put(_END)


def convert_unit(src: Source, unit: str, out_path: str, mode: str, progress=None) -> dict:
    """Write one unit's output file (temp, fsync, rename); return its record's tensor part."""
    tensors = src.unit_tensors(unit)
    specs = out_specs(tensors)
    header = st.build_header(specs)
    tmp = tmp_name(out_path)
    q_quant: queue.Queue = queue.Queue(DEPTH)
    q_write: queue.Queue = queue.Queue(DEPTH)
    out_hash = blake3.blake3()
    fd_out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    crashpoint(f"{unit}: output opened")
    state = {"written": 0, "since_sync": 0, "tensors": 0}

    def write(item):
        kind, payload, nbytes, release = item
        mv = memoryview(payload).cast("B")
        out_hash.update(mv)
        done = 0
        while done < len(mv):
            done += os.write(fd_out, mv[done:])
        state["written"] += len(mv)
        state["since_sync"] += len(mv)
        if state["since_sync"] >= SYNC_EVERY:
            os.fdatasync(fd_out)  # keeps dirty pages bounded and the final fsync short
            state["since_sync"] = 0
        if kind == "end-of-tensor":
            state["tensors"] += 1
            if state["tensors"] == 1:
                crashpoint(f"{unit}: first tensor written")
        if release is not None:
            release()
        if progress is not None and nbytes:
            progress.advance(nbytes, 1 if kind == "end-of-tensor" else 0)

    def quantize(item):
        kind = item[0]
        if kind != "quant":
            q_write.put(item)
            return
        _, t, buf, data = item
        e = t.entry
        n_q = e.nbytes // 4  # two elements per byte, from two bytes each
        n_s = e.nbytes // 2 // mxfp4.BLOCK
        out = out_pool.take()
        if data.ctypes.data % 2:  # an odd offset in the file: the kernel wants aligned uint16
            data = data.copy()
        try:
            packed, scales = mxfp4.quantize(data.view(np.uint16).reshape(e.shape), mode,
                                            out_q=out[:n_q], out_s=out[n_q:n_q + n_s])
        except mxfp4.NonFiniteError as exc:
            raise InputError(f"{src.headers[t.shard].path}: tensor {t.name} has a non-finite value "
                             f"({exc.value}) at index {list(exc.index)}; nothing is quantized from it") from None
        finally:
            in_pool.give(buf)
        q_write.put(("part", packed, 0, None))
        q_write.put(("end-of-tensor", scales, e.nbytes, lambda: out_pool.give(out)))

    largest_q = max((t.entry.nbytes for t in tensors if t.quantized), default=0)
    in_pool = _Pool(IN_SLOTS, max(CHUNK, largest_q), aligned=True)
    out_pool = _Pool(OUT_SLOTS, largest_q // 4 + largest_q // 2 // mxfp4.BLOCK)
    def discard(item):
        if item[0] == "quant":
            in_pool.give(item[2])
        elif item[3] is not None:
            item[3]()

    writer = _Stage(write, q_write, None, discard)
    quant = _Stage(quantize, q_quant, q_write, discard)
    writer.start()
    quant.start()
    hashes: dict[str, str] = {}
    readers: dict[str, SourceReader] = {}
    ok = False
    try:
        q_write.put(("header", header, 0, None))
        for t in tensors:
            if quant.error or writer.error:
                break
            reader = readers.get(t.shard)
            if reader is None:
                reader = readers[t.shard] = SourceReader(src.headers[t.shard].path)
            h = blake3.blake3()
            e = t.entry
            if t.quantized:
                buf = in_pool.take()
                data = reader.read(buf, e.begin, e.nbytes)
                h.update(data)
                q_quant.put(("quant", t, buf, data))
            else:
                pos = e.begin
                while pos < e.end:
                    n = min(CHUNK, e.end - pos)
                    buf = in_pool.take()
                    view = reader.read(buf, pos, n)
                    h.update(view)
                    pos += n
                    last = pos >= e.end
                    q_quant.put(("end-of-tensor" if last else "part", view, e.nbytes if last else 0,
                                 lambda b=buf: in_pool.give(b)))
                if e.nbytes == 0:
                    q_quant.put(("end-of-tensor", b"", 0, None))
            hashes[t.name] = h.hexdigest()
            # the source pages are not needed again; leave the page cache to the next reads
            reader.drop(e.begin, e.nbytes)
        q_quant.put(_END)
        quant.join()
        writer.join()
        for stage in (quant, writer):
            if stage.error is not None:
                raise stage.error
        expected = len(header) + st.data_size(specs)
        if state["written"] != expected:
            raise RuntimeError(f"{tmp}: wrote {state['written']} bytes, expected {expected}")
        crashpoint(f"{unit}: data written, before fsync")
        os.fsync(fd_out)
        ok = True
    finally:
        if not ok:
            q_quant.put(_END)
            quant.join()
            writer.join()
        os.close(fd_out)
        for reader in readers.values():
            reader.close()
        if not ok:
            with _suppress():
                os.unlink(tmp)
    crashpoint(f"{unit}: output fsynced, before rename")
    os.replace(tmp, out_path)
    fsync_dir(os.path.dirname(out_path))
    crashpoint(f"{unit}: output renamed, before record")
    return {
        "tensors": {t.name: {"shard": t.shard, "dtype": t.entry.dtype, "shape": list(t.entry.shape),
                             "quantized": t.quantized, "blake3": hashes[t.name]} for t in tensors},
        "outputs": {s.name: {"dtype": s.dtype, "shape": list(s.shape)} for s in specs},
        "output_size": state["written"],
        "output_blake3": out_hash.hexdigest(),
        "data_bytes": st.data_size(specs),
    }


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)
