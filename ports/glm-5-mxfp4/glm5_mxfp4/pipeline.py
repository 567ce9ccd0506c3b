"""One work unit: read the source tensors, quantize the routed experts, stream one output file.

The stages overlap (see `convert_unit`): one thread only reads (O_DIRECT where possible, into a
buffer from a fixed pool); one compute thread per core hashes and quantizes a routed-expert tensor
(blake3 and the numba kernel both release the GIL); one thread hashes and writes the output in
order (O_DIRECT where possible). An item is one routed-expert tensor or a chunk of at most CHUNK
bytes of a copied tensor; the pools' buffers are recycled, so a worker holds IN_SLOTS + OUT_SLOTS
buffers (and one staging buffer) however large the tensors of the source are.
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
STAGE = 8 << 20  # one direct-write staging buffer
# direct writes in flight (flusher threads), a staging buffer each plus the one filling. One: the
# next buffer fills while the last is written; two were not faster on this machine's disk in
# bench/bench_convert.py, which runs the other depth side by side. GLM5_MXFP4_WRITE_DEPTH overrides.
WRITE_DEPTH = max(1, int(os.environ.get("GLM5_MXFP4_WRITE_DEPTH", "1")))
DIRECT_WRITES = True  # tests turn it off to run the plain path
IN_SLOTS = 6  # read buffers, recycled: fresh allocations would fault in (and zero) every page
OUT_SLOTS = 6  # output buffers (a quarter of a read buffer each), taken in stream order
_END = object()


ALIGN = 4096


def aligned_buffer(size: int) -> np.ndarray:
    """A uint8 buffer whose address is a multiple of ALIGN, with room to read whole aligned blocks."""
    raw = np.empty(size + 3 * ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGN
    return raw[skip : skip + size + 2 * ALIGN]


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
                mv = buf.data
                while got < skip + n:
                    if got % ALIGN:  # a short read left us unaligned: finish the plain way
                        _pread_into(self.fd, mv[got : skip + n], start + got)
                        break
                    r = os.preadv(self.dfd, [mv[got:length]], start + got)
                    if r <= 0:
                        raise OSError(f"{self.path}: short read at offset {start + got}")
                    got += r
                return buf[skip : skip + n]
        _pread_into(self.fd, buf.data[:n], begin)
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


class _Item:
    """One step of the output stream, handed from the reader to the writer in file order. A
    routed-expert tensor is quantized by a compute thread first (`done` is set when it is); a chunk
    of a copied tensor is ready as read."""

    __slots__ = ("tensor", "buf", "data", "out", "last", "digest", "error", "done")

    def __init__(self, tensor: Tensor | None, buf, data, out=None, last: bool = True):
        self.tensor, self.buf, self.data, self.out, self.last = tensor, buf, data, out, last
        self.digest = self.error = None
        self.done = threading.Event()
        if out is None:
            self.done.set()


def compute_threads() -> int:
    """How many tensors are quantized at once: numba's thread count (the cores, or the share that
    `--workers N` gives each process through NUMBA_NUM_THREADS)."""
    import numba

    return max(1, int(numba.config.NUMBA_NUM_THREADS))


class OutputFile:
    """The unit's output, written front to back. With O_DIRECT where the file system allows it:
    the bytes go through aligned staging buffers straight to the disk, with no page-cache copy
    (buffered writes of the output cost about 1.8 CPU seconds per GB here, more than the
    quantization) and no dirty pages to bound. A full staging buffer is handed to one of
    WRITE_DEPTH flusher threads, which pwrite it at its offset (the layout is fixed by the header),
    so up to WRITE_DEPTH writes are in flight while the next buffer fills: one synchronous direct
    write at a time leaves the disk idle between writes. The last partial block is written the
    plain way. Otherwise plain writes, fdatasync-ed every SYNC_EVERY bytes to keep dirty pages
    bounded."""

    def __init__(self, path: str):
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = None
        if DIRECT_WRITES and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(path, flags | os.O_DIRECT, 0o644)
            except OSError:  # e.g. tmpfs
                fd = None
        self.direct = fd is not None
        self.fd: int = os.open(path, flags, 0o644) if fd is None else fd
        self.fill = 0  # bytes waiting in `stage`
        self.written = 0  # bytes accepted
        self.pos = 0  # file offset of stage[0]
        self.since_sync = 0
        self.stage: np.ndarray | None = None
        self._flushers: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        # staged: every byte goes through the staging buffers and pwrite at its offset, even if the
        # file system later refuses O_DIRECT (then those pwrites are plain): never mix in os.write
        self.staged = self.direct
        if self.staged:
            self._free: queue.Queue = queue.Queue()
            for _ in range(WRITE_DEPTH):
                self._free.put(aligned_buffer(STAGE)[:STAGE])
            self.stage = aligned_buffer(STAGE)[:STAGE]
            self._todo: queue.Queue = queue.Queue()
            self._flushers = [threading.Thread(target=self._flusher, daemon=True) for _ in range(WRITE_DEPTH)]
            for t in self._flushers:
                t.start()

    def write(self, mv: memoryview) -> None:
        self.written += len(mv)
        if not self.staged:
            self._plain(mv)
            return
        assert self.stage is not None, "write after finish"
        while len(mv):
            n = min(len(mv), STAGE - self.fill)
            self.stage[self.fill : self.fill + n] = mv[:n]
            self.fill += n
            mv = mv[n:]
            if self.fill == STAGE:
                self._raise()
                self._todo.put((self.stage, self.pos, STAGE))
                self.pos += STAGE
                self.fill = 0
                self.stage = self._free.get()

    def _flusher(self) -> None:
        while (job := self._todo.get()) is not None:
            buf, pos, n = job
            try:
                if not self._errors:
                    self._pwrite(buf, pos, n)
            except BaseException as exc:
                self._errors.append(exc)
            finally:
                self._free.put(buf)

    def _pwrite(self, buf: np.ndarray, pos: int, n: int) -> None:
        """Bytes [0, n) of `buf` at `pos`: direct while the file system takes it, else plain (a file
        system that opens with O_DIRECT but refuses the write)."""
        mv = buf.data
        done = 0
        while done < n:
            try:
                r = os.pwrite(self.fd, mv[done:n], pos + done)
            except OSError:
                if not self._direct_flag():
                    raise
                self._to_plain()
                continue
            if r <= 0:
                raise OSError(f"{self.path}: short write at offset {pos + done}")
            done += r

    def _direct_flag(self) -> bool:
        import fcntl

        return bool(fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_DIRECT)

    def _to_plain(self) -> None:
        import fcntl

        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self.direct = False

    def _raise(self) -> None:
        if self._errors:
            raise self._errors[0]

    def _plain(self, mv: memoryview) -> None:
        done = 0
        while done < len(mv):
            done += os.write(self.fd, mv[done:])
        self.since_sync += len(mv)
        if self.since_sync >= SYNC_EVERY:
            os.fdatasync(self.fd)  # keeps dirty pages bounded and the final fsync short
            self.since_sync = 0

    def _drain(self) -> None:
        for _ in self._flushers:
            self._todo.put(None)
        for t in self._flushers:
            t.join()
        self._flushers = []

    def finish(self) -> None:
        """Everything accepted is in the file (not yet fsynced)."""
        if self.stage is None:
            return
        self._drain()
        self._raise()
        whole = self.fill - self.fill % ALIGN
        if whole:
            self._pwrite(self.stage, self.pos, whole)
        if self.fill > whole:  # the last partial block: O_DIRECT takes whole blocks only
            if self._direct_flag():
                self._to_plain()
            tail = self.stage.data[whole : self.fill]
            done = 0
            while done < len(tail):
                done += os.pwrite(self.fd, tail[done:], self.pos + whole + done)
        self.pos += self.fill
        self.fill = 0
        self.stage = None

    def close(self) -> None:
        if self._flushers:  # an error path: stop the flushers before the descriptor goes
            self._drain()
        os.close(self.fd)


def convert_unit(src: Source, unit: str, out_path: str, mode: str, progress=None) -> dict:
    """Write one unit's output file (temp, fsync, rename); return its record's tensor part.

    Threads: this one reads (only I/O: the disk never waits for the CPU work) and hands each item
    to the writer, in file order, and each routed-expert tensor to one of `compute_threads()`
    compute threads, which hash it (blake3 of the source bytes) and quantize it, both without the
    GIL; the writer hashes copied tensors and the output and writes, in order. Buffers come from
    fixed pools and are taken in stream order (an item gets its output buffer when it is read), so
    no stage can hold what an earlier item waits for."""
    tensors = src.unit_tensors(unit)
    specs = out_specs(tensors)
    header = st.build_header(specs)
    tmp = tmp_name(out_path)
    ncompute = compute_threads()
    q_work: queue.Queue = queue.Queue()
    q_write: queue.Queue = queue.Queue()
    out_hash = blake3.blake3()
    out = OutputFile(tmp)
    crashpoint(f"{unit}: output opened")
    state = {"tensors": 0}
    hashes: dict[str, str] = {}
    failed = threading.Event()
    errors: list[BaseException] = []

    largest_q = max((t.entry.nbytes for t in tensors if t.quantized), default=0)
    in_pool = _Pool(IN_SLOTS, max(CHUNK, largest_q), aligned=True)
    out_pool = _Pool(OUT_SLOTS, largest_q // 4 + largest_q // 2 // mxfp4.BLOCK)

    def fail(exc: BaseException) -> None:
        errors.append(exc)
        failed.set()

    def emit(mv: memoryview) -> None:
        out_hash.update(mv)
        out.write(mv)

    def compute() -> None:
        while (item := q_work.get()) is not _END:
            try:
                if not failed.is_set():
                    t = item.tensor
                    e = t.entry
                    rows, k = e.shape
                    data = item.data
                    if data.ctypes.data % 2:  # an odd offset in the file: the kernel wants aligned uint16
                        data = data.copy()
                    x2 = data.view(np.uint16).reshape(rows, k)
                    n_q = rows * (k // 2)
                    q2 = item.out[:n_q].reshape(rows, k // 2)
                    s2 = item.out[n_q : n_q + rows * (k // mxfp4.BLOCK)].reshape(rows, k // mxfp4.BLOCK)
                    # the whole tensor in one call each: hashing and quantizing it in cache-sized
                    # chunks cost more CPU time here (more calls, more GIL hand-overs), not less
                    item.digest = blake3.blake3(data).hexdigest()
                    mxfp4.quantize_rows(x2, mode, q2, s2, 0, rows)
                    item.data = item.out[: n_q + rows * (k // mxfp4.BLOCK)]
            except mxfp4.NonFiniteError as exc:
                item.error = InputError(
                    f"{src.headers[item.tensor.shard].path}: tensor {item.tensor.name} has a "
                    f"non-finite value ({exc.value}) at index {list(exc.index)}; nothing is "
                    "quantized from it"
                )
                fail(item.error)
            except BaseException as exc:
                item.error = exc
                fail(exc)
            finally:
                in_pool.give(item.buf)
                item.buf = None
                item.done.set()

    def write() -> None:
        thash = None
        while (item := q_write.get()) is not _END:
            item.done.wait()
            try:
                if failed.is_set():
                    continue
                if isinstance(item.data, bytes):  # the header
                    emit(memoryview(item.data))
                    continue
                t = item.tensor
                if t.quantized:
                    emit(memoryview(item.data))  # packed codes, then scales: one region of the buffer
                    hashes[t.name] = item.digest
                else:
                    if thash is None:
                        thash = blake3.blake3()
                    mv = memoryview(item.data).cast("B")
                    thash.update(mv)
                    emit(mv)
                    if item.last:
                        hashes[t.name] = thash.hexdigest()
                        thash = None
                if item.last:
                    state["tensors"] += 1
                    if state["tensors"] == 1:
                        crashpoint(f"{unit}: first tensor written")
                    if progress is not None:
                        progress.advance(t.entry.nbytes, 1)
            except BaseException as exc:
                fail(exc)
            finally:
                if item.out is not None:
                    out_pool.give(item.out)
                elif item.buf is not None:
                    in_pool.give(item.buf)

    workers = [threading.Thread(target=compute, daemon=True) for _ in range(ncompute if largest_q else 0)]
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    for w in workers:
        w.start()
    readers: dict[str, SourceReader] = {}
    ok = False
    try:
        try:
            q_write.put(_Item(None, None, header))
            for t in tensors:
                if failed.is_set():
                    break
                reader = readers.get(t.shard)
                if reader is None:
                    reader = readers[t.shard] = SourceReader(src.headers[t.shard].path)
                e = t.entry
                if t.quantized:
                    buf = in_pool.take()
                    obuf = out_pool.take()
                    item = _Item(t, buf, reader.read(buf, e.begin, e.nbytes), obuf)
                    q_write.put(item)
                    q_work.put(item)
                elif e.nbytes == 0:
                    q_write.put(_Item(t, None, np.empty(0, dtype=np.uint8)))
                else:
                    pos = e.begin
                    while pos < e.end and not failed.is_set():
                        n = min(CHUNK, e.end - pos)
                        buf = in_pool.take()
                        view = reader.read(buf, pos, n)
                        pos += n
                        q_write.put(_Item(t, buf, view, last=pos >= e.end))
                # the source pages are not needed again; leave the page cache to the next reads
                reader.drop(e.begin, e.nbytes)
        except BaseException as exc:
            fail(exc)
        finally:
            for _ in workers:
                q_work.put(_END)
            for w in workers:
                w.join()
            q_write.put(_END)
            writer.join()
        if errors:
            raise errors[0]
        out.finish()
        expected = len(header) + st.data_size(specs)
        if out.written != expected:
            raise RuntimeError(f"{tmp}: wrote {out.written} bytes, expected {expected}")
        crashpoint(f"{unit}: data written, before fsync")
        os.fsync(out.fd)
        ok = True
    finally:
        out.close()
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
        "tensors": {
            t.name: {
                "shard": t.shard,
                "dtype": t.entry.dtype,
                "shape": list(t.entry.shape),
                "quantized": t.quantized,
                "blake3": hashes[t.name],
            }
            for t in tensors
        },
        "outputs": {s.name: {"dtype": s.dtype, "shape": list(s.shape)} for s in specs},
        "output_size": out.written,
        "output_blake3": out_hash.hexdigest(),
        "data_bytes": st.data_size(specs),
    }


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)
