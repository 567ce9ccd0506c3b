"""glm-5-mxfp4 converter throughput against the cold read rate of the same source, in one run.

    PYTHONPATH=ports/glm-5-mxfp4 .venv/bin/python bench/bench_convert.py [--experts 256] [--dir TMPDIR] [--keep] [--src KEPT_SRC]

(the port's glm5_mxfp4 package imports from its folder: PYTHONPATH, as the converter's workers get it)

Builds a synthetic glm_moe_dsa checkpoint holding one full-size MoE layer (by default 256 experts,
gate/up [2048, 6144] and down [6144, 2048] in BF16, N(0, 0.02): 19.3 GB, in 5 GB shards) plus that
layer's attention and router tensors. Then, each time after dropping the page cache for those
files (posix_fadvise DONTNEED after fsync):
  1. reads the layer's tensors in the converter's order with the converter's reader (its
     SourceReader: O_DIRECT where the file system allows it, the same chunks), nothing else: the
     cold sequential read rate;
  2. runs the converter on that layer as a worker process (`--layers 0:1`): its rate, measured from
     process start to exit, and its peak RSS;
  3. runs it again with another number of output writes in flight (GLM5_MXFP4_WRITE_DEPTH: 2 if the
     converter's is 1, else 1), side by side.
Prints the ratio (goal >= 0.6), GB/s, peak RSS against 2 x the largest tensor + 300 MB, the
projected time for the 1.508 TB release, the kernel alone, what the output writer costs buffered and
with O_DIRECT, the scale modes' error, the CPU model and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from glm5_mxfp4 import mxfp4, pipeline, st
from glm5_mxfp4.pipeline import CHUNK, SourceReader, aligned_buffer
from glm5_mxfp4.source import Source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = os.path.join(ROOT, "ports", "glm-5-mxfp4")
RELEASE_BYTES = 1.508e12
HIDDEN, INTER, SHARD = 6144, 2048, 5 * 10**9
ALT_DEPTH = 2 if pipeline.WRITE_DEPTH == 1 else 1  # the write depth run beside the converter's


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def bf16_normal(rng, shape, std=0.02) -> np.ndarray:
    f = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).view(np.uint32)
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def build(root: str, experts: int) -> None:
    rng = np.random.default_rng(0)
    pool_up = [bf16_normal(rng, (INTER, HIDDEN)) for _ in range(8)]  # a pool of distinct tensors, reused
    pool_down = [bf16_normal(rng, (HIDDEN, INTER)) for _ in range(8)]
    small = {
        "model.layers.0.input_layernorm.weight": ((HIDDEN,), "BF16"),
        "model.layers.0.post_attention_layernorm.weight": ((HIDDEN,), "BF16"),
        "model.layers.0.self_attn.q_a_proj.weight": ((2048, HIDDEN), "BF16"),
        "model.layers.0.self_attn.q_b_proj.weight": ((64 * 256, 2048), "BF16"),
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": ((576, HIDDEN), "BF16"),
        "model.layers.0.self_attn.kv_b_proj.weight": ((64 * 448, 512), "BF16"),
        "model.layers.0.self_attn.o_proj.weight": ((HIDDEN, 64 * 256), "BF16"),
        "model.layers.0.mlp.gate.weight": ((256, HIDDEN), "BF16"),
        "model.layers.0.mlp.gate.e_score_correction_bias": ((256,), "F32"),
        "model.layers.0.mlp.shared_experts.gate_proj.weight": ((INTER, HIDDEN), "BF16"),
        "model.layers.0.mlp.shared_experts.up_proj.weight": ((INTER, HIDDEN), "BF16"),
        "model.layers.0.mlp.shared_experts.down_proj.weight": ((HIDDEN, INTER), "BF16"),
        "model.norm.weight": ((HIDDEN,), "BF16"),
    }
    tensors: list[tuple[str, tuple, str, object]] = [(n, s, d, None) for n, (s, d) in small.items()]
    for e in range(experts):
        for p in ("gate_proj", "up_proj"):
            tensors.append((f"model.layers.0.mlp.experts.{e}.{p}.weight", (INTER, HIDDEN), "BF16", pool_up[(2 * e + (p == "up_proj")) % 8]))
        tensors.append((f"model.layers.0.mlp.experts.{e}.down_proj.weight", (HIDDEN, INTER), "BF16", pool_down[e % 8]))
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nbytes = st.OutSpec(t[0], t[2], t[1]).nbytes
        if size + nbytes > SHARD and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    weight_map = {}
    for i, group in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        specs = [st.OutSpec(n, d, s) for n, s, d, _ in group]
        with open(os.path.join(root, name), "wb") as f:
            f.write(st.build_header(specs))
            for n, s, d, data in group:
                if data is None:
                    data = bf16_normal(rng, s) if d == "BF16" else np.zeros(s, dtype=np.float32)
                f.write(memoryview(np.ascontiguousarray(data)).cast("B"))
                weight_map[n] = name
            f.flush()
            os.fsync(f.fileno())
    config = {"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"], "hidden_size": HIDDEN,
              "moe_intermediate_size": INTER, "n_routed_experts": experts, "num_hidden_layers": 1}
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(root, "LICENSE"), "w") as f:
        f.write("synthetic benchmark checkpoint\n")


def peak_rss(pid: int) -> int:
    """The process's high-water RSS (VmHWM) in bytes; it starts afresh at exec, so the parent's
    pages, shared by fork until then, do not count (getrusage's children figure counts them)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def drop_cache(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_read(src: Source, unit: str) -> tuple[int, float, bool]:
    """The converter's reader alone: its tensors, its order, its chunking, into one aligned buffer."""
    total = 0
    readers: dict[str, SourceReader] = {}
    largest = max(t.entry.nbytes for t in src.unit_tensors(unit) if t.quantized)
    buf = aligned_buffer(max(CHUNK, largest))
    t0 = time.perf_counter()
    for t in src.unit_tensors(unit):
        reader = readers.get(t.shard) or readers.setdefault(t.shard, SourceReader(src.headers[t.shard].path))
        e = t.entry
        if t.quantized:
            reader.read(buf, e.begin, e.nbytes)
        else:
            for pos in range(e.begin, e.end, CHUNK):
                reader.read(buf, pos, min(CHUNK, e.end - pos))
        total += e.nbytes
    dt = time.perf_counter() - t0
    direct = all(r.direct for r in readers.values())
    for r in readers.values():
        r.close()
    return total, dt, direct


def write_cost(folder: str, nbytes: int, direct: bool, depth: int = pipeline.WRITE_DEPTH) -> tuple[float, float, bool]:
    """The converter's output writer (pipeline.OutputFile) alone, `nbytes` in 6.7 MB pieces (one
    expert's codes and scales), then fsync, with `depth` direct writes in flight: wall seconds, CPU
    seconds of this process (user + sys: the writes run on the writer's flusher threads), and
    whether O_DIRECT was used."""
    import resource

    piece = np.random.default_rng(1).integers(0, 256, 2048 * 3072 + 2048 * 192, dtype=np.uint8)
    path = os.path.join(folder, f"write-{'direct' if direct else 'plain'}")
    pipeline.DIRECT_WRITES = direct
    default_depth, pipeline.WRITE_DEPTH = pipeline.WRITE_DEPTH, depth
    try:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = pipeline.OutputFile(path)
        used = out.direct
        try:
            done = 0
            while done < nbytes:
                out.write(memoryview(piece))
                done += len(piece)
            out.finish()
            os.fsync(out.fd)
        finally:
            out.close()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    finally:
        pipeline.DIRECT_WRITES, pipeline.WRITE_DEPTH = True, default_depth
        if os.path.exists(path):
            os.unlink(path)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), used


def run_converter(src_dir: str, dst_dir: str, **env) -> tuple[float, float, int] | None:
    """The converter on the layer as a worker process (`--layers 0:1`): wall seconds from process
    start to exit, its CPU seconds (user + sys) and its peak RSS; None if it failed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "glm5_mxfp4.convert", src_dir, dst_dir, "--layers", "0:1", "--quiet"],
                            cwd=PORT, env=dict(os.environ, PYTHONPATH=PORT, **env))
    rss = 0
    while True:
        rss = max(rss, peak_rss(proc.pid))
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        print(f"converter exited {os.waitstatus_to_exitcode(status)}", file=sys.stderr)
        return None
    return wall, usage.ru_utime + usage.ru_stime, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--dir", default=None, help="where to write the synthetic checkpoint (default: the temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint (its path is printed)")
    ap.add_argument("--src", default=None,
                    help="reuse a synthetic checkpoint kept by an earlier --keep run (its src folder; left in place)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bench-convert-", dir=args.dir)
    need = (0 if args.src else args.experts * 3 * INTER * HIDDEN * 2) * 1.3 + 1e9
    free = shutil.disk_usage(base).free
    if free < need:
        print(f"{base}: {free / 1e9:.1f} GB free, the benchmark needs {need / 1e9:.1f} GB", file=sys.stderr)
        shutil.rmtree(base)
        return 2
    src_dir, dst_dir = args.src or os.path.join(base, "src"), os.path.join(base, "dst")
    try:
        t0 = time.perf_counter()
        if not args.src:
            os.mkdir(src_dir)
            build(src_dir, args.experts)
        build_s = time.perf_counter() - t0
        src = Source(src_dir)
        args.experts = sum(1 for n in src.tensors if n.endswith(".gate_proj.weight") and ".experts." in n)
        shards = [h.path for h in src.headers.values()]
        unit = "layer-0"
        largest = max(t.entry.nbytes for t in src.tensors.values())
        print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); load average before: "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"synthetic layer: {args.experts} experts, {src.unit_bytes(unit) / 1e9:.2f} GB in {len(shards)} shards "
              + (f"(reused {src_dir})" if args.src else f"(built in {build_s:.0f} s)"))
        # 1. cold read
        drop_cache(shards)
        nbytes, read_s, direct = cold_read(src, unit)
        read_rate = nbytes / read_s
        # 2. the converter, as a worker process; then again with one output write in flight
        drop_cache(shards)
        load_before = os.getloadavg()[0]
        run = run_converter(src_dir, dst_dir)
        if run is None:
            return 1
        conv_s, cpu_s, rss = run
        load_after = os.getloadavg()[0]
        cores = os.cpu_count() or 1
        conv_rate = nbytes / conv_s
        out_bytes = os.path.getsize(os.path.join(dst_dir, src.unit_file(unit)))
        shutil.rmtree(dst_dir)
        drop_cache(shards)
        run = run_converter(src_dir, dst_dir, GLM5_MXFP4_WRITE_DEPTH=str(ALT_DEPTH))
        if run is None:
            return 1
        one_s = run[0]
        # the scale modes' error on the same data (one expert's gate_proj)
        t = src.tensors["model.layers.0.mlp.experts.0.gate_proj.weight"]
        with open(src.headers[t.shard].path, "rb") as f:
            f.seek(t.entry.begin)
            w = np.frombuffer(f.read(t.entry.nbytes), dtype=np.uint16).reshape(t.entry.shape)
        err = {m: mxfp4.relative_error(w, m) for m in mxfp4.SCALE_MODES}
        # the kernel alone, in memory, on 8 such tensors (wall and CPU time of this process)
        block = np.ascontiguousarray(np.broadcast_to(w, (8, *w.shape)))
        mxfp4.quantize(block[:1], "even")  # compiled or loaded from the cache before timing
        w0, c0 = time.perf_counter(), time.process_time()
        mxfp4.quantize(block, "even")
        kern_wall, kern_cpu = time.perf_counter() - w0, time.process_time() - c0
        # what the output writes cost, buffered or O_DIRECT (1 GB, or the output size if smaller)
        w_bytes = min(out_bytes, 10**9)
        w_plain, c_plain, _ = write_cost(base, w_bytes, direct=False)
        w_direct, c_direct, used_direct = write_cost(base, w_bytes, direct=True)
        w_one, c_one, _ = write_cost(base, w_bytes, direct=True, depth=ALT_DEPTH)
        goal_rss = 2 * largest + 300e6
        rows = [
            ("cold sequential read, converter's reader", f"{read_rate / 1e9:.2f} GB/s",
             f"{read_s:.1f} s, {'O_DIRECT' if direct else 'buffered'}"),
            ("converter, one worker (--layers 0:1), process start to exit", f"{conv_rate / 1e9:.2f} GB/s", f"{conv_s:.1f} s"),
            ("ratio converter / read (goal >= 0.6)", f"{conv_rate / read_rate:.2f}", ""),
            (f"converter with {ALT_DEPTH} output writes in flight, not {pipeline.WRITE_DEPTH} (ratio)", f"{nbytes / one_s / 1e9:.2f} GB/s",
             f"{one_s:.1f} s (ratio {nbytes / one_s / read_rate:.2f})"),
            ("output / input bytes", f"{out_bytes / nbytes:.4f}", "4.25 / 16 = 0.2656 for the experts"),
            ("peak RSS of the worker", f"{rss / 1e6:.0f} MB", f"goal <= 2 x {largest / 1e6:.0f} MB + 300 MB = {goal_rss / 1e6:.0f} MB"),
            ("converter CPU time (user + sys), share of the cores it got", f"{cpu_s:.1f} s",
             f"{100 * cpu_s / conv_s / cores:.0f} % of {cores} cores over its run"),
            ("converter bytes per CPU second", f"{nbytes / cpu_s / 1e9:.2f} GB/s", ""),
            ("projected 1.508 TB release at the measured rate, one machine", f"{RELEASE_BYTES / conv_rate / 60:.0f} min", ""),
            ("quantization kernel alone, in memory (wall; per CPU second)",
             f"{block.nbytes / kern_wall / 1e9:.2f} GB/s", f"{block.nbytes / kern_cpu / 1e9:.2f} GB/s per CPU second"),
            (f"output writer alone, {w_bytes / 1e9:.2f} GB: buffered, fdatasync every 512 MB",
             f"{c_plain / (w_bytes / 1e9):.2f} CPU s per GB", f"{w_bytes / w_plain / 1e9:.2f} GB/s"),
            (f"output writer alone, {w_bytes / 1e9:.2f} GB: " + ("O_DIRECT" if used_direct else "O_DIRECT unavailable, plain")
             + f", {pipeline.WRITE_DEPTH} writes in flight (the converter's)",
             f"{c_direct / (w_bytes / 1e9):.2f} CPU s per GB", f"{w_bytes / w_direct / 1e9:.2f} GB/s"),
            (f"output writer alone, {w_bytes / 1e9:.2f} GB: the same, {ALT_DEPTH} writes in flight",
             f"{c_one / (w_bytes / 1e9):.2f} CPU s per GB", f"{w_bytes / w_one / 1e9:.2f} GB/s"),
            ("relative error of dequant(quant(w)), N(0, 0.02) expert", f"floor {err['floor']:.4f}, even {err['even']:.4f}", ""),
            ("load average (1 min) before / after the converter run", f"{load_before:.2f} / {load_after:.2f}", f"{os.cpu_count()} cores"),
        ]
        width = max(len(r[0]) for r in rows)
        for r in rows:
            print(f"{r[0]:<{width}}  {r[1]:>24}  {r[2]}")
        return 0
    finally:
        if args.keep and not args.src:
            shutil.rmtree(dst_dir, ignore_errors=True)
            print(f"kept {src_dir}")
        else:
            shutil.rmtree(base, ignore_errors=True)  # with --src: only the output is in it


if __name__ == "__main__":
    sys.exit(main())
