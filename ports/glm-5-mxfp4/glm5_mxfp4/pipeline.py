"""One work unit: read the source tensors, quantize the routed experts, stream one output file.

Three stages overlap: the caller's thread reads (pread into a buffer from a fixed pool, hashing
as it goes), a thread quantizes (the numba kernel releases the GIL and uses every core), a thread
writes (hashing and fdatasync-ing as it goes). An item is one routed-expert tensor or a chunk of
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


class _Pool:
    """A fixed set of equal buffers handed round the stages; `take` blocks until one is free."""

    def __init__(self, count: int, size: int):
        self.free: queue.Queue = queue.Queue()
        for _ in range(count if size else 0):
            self.free.put(np.empty(size, dtype=np.uint8))

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
        _, t, buf = item
        e = t.entry
        *rows, k = e.shape
        n_q = e.nbytes // 4  # two elements per byte, from two bytes each
        n_s = e.nbytes // 2 // mxfp4.BLOCK
        out = out_pool.take()
        try:
            packed, scales = mxfp4.quantize(buf[: e.nbytes].view(np.uint16).reshape(e.shape), mode,
                                            out_q=out[:n_q], out_s=out[n_q:n_q + n_s])
        except mxfp4.NonFiniteError as exc:
            raise InputError(f"{src.headers[t.shard].path}: tensor {t.name} has a non-finite value "
                             f"({exc.value}) at index {list(exc.index)}; nothing is quantized from it") from None
        finally:
            in_pool.give(buf)
        q_write.put(("part", packed, 0, None))
        q_write.put(("end-of-tensor", scales, e.nbytes, lambda: out_pool.give(out)))

    largest_q = max((t.entry.nbytes for t in tensors if t.quantized), default=0)
    in_pool = _Pool(IN_SLOTS, max(CHUNK, largest_q))
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
    fds: dict[str, int] = {}
    ok = False
    try:
        q_write.put(("header", header, 0, None))
        for t in tensors:
            if quant.error or writer.error:
                break
            fd = fds.get(t.shard)
            if fd is None:
                fd = fds[t.shard] = os.open(src.headers[t.shard].path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            h = blake3.blake3()
            e = t.entry
            if t.quantized:
                buf = in_pool.take()
                mv = memoryview(buf)[: e.nbytes]
                _pread_into(fd, mv, e.begin)
                h.update(mv)
                q_quant.put(("quant", t, buf))
            else:
                pos = e.begin
                while pos < e.end:
                    n = min(CHUNK, e.end - pos)
                    buf = in_pool.take()
                    view = buf[:n]
                    _pread_into(fd, memoryview(view), pos)
                    h.update(view)
                    pos += n
                    last = pos >= e.end
                    q_quant.put(("end-of-tensor" if last else "part", view, e.nbytes if last else 0,
                                 lambda b=buf: in_pool.give(b)))
                if e.nbytes == 0:
                    q_quant.put(("end-of-tensor", b"", 0, None))
            hashes[t.name] = h.hexdigest()
            # the source pages are not needed again; leave the page cache to the next reads
            os.posix_fadvise(fd, e.begin, e.nbytes, os.POSIX_FADV_DONTNEED)
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
        for fd in fds.values():
            os.close(fd)
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
