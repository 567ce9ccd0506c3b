"""Convert a BF16 glm_moe_dsa checkpoint to MXFP4 routed experts.

    python -m glm5_mxfp4.convert SRC DST --layers A:B        one layer-range worker (layers A..B-1)
    python -m glm5_mxfp4.convert SRC DST --other             every tensor outside the decoder layers
    python -m glm5_mxfp4.convert SRC DST --task-index I|auto --task-count N   task I of a scheduler's N
    python -m glm5_mxfp4.convert SRC DST --finalize          index, config, tokenizer files, LICENSE
    python -m glm5_mxfp4.convert SRC DST --workers N         all of it here as N processes, then finalize
    python -m glm5_mxfp4.convert verify SRC DST [--sample N] re-read DST against SRC

Exit status: 0 done; 2 refused (the message names the file and the item; nothing was written);
3 verify found a difference; 1 anything else.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys

from . import __version__, mxfp4, st
from .output import Dest, dump, load, write_atomic
from .pipeline import CHUNK, convert_unit, out_specs
from .progress import Progress
from .source import COPIED_FILES, INDEX, InputError, Source

LAYOUT = "per-expert"
LAYOUT_TEXT = (
    "per-expert: <module>.weight uint8 [out, in/2] (E2M1, element 2i in the low nibble) and "
    "<module>.weight_scale uint8 [out, in/32] (E8M0, bias 127); every other tensor unchanged"
)
MODULES = [
    "model.layers.*.mlp.experts.*.gate_proj",
    "model.layers.*.mlp.experts.*.up_proj",
    "model.layers.*.mlp.experts.*.down_proj",
]
DEFAULT_MODE = "even"
TASK_INDEX_ENV = ("JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID")


class VerifyError(Exception):
    pass


def make_plan(src: Source, mode: str) -> dict:
    return {
        "format": 1,
        "converter": f"glm5_mxfp4 {__version__}",
        "source_index_sha256": src.index_sha256,
        "scale_mode": mode,
        "block_size": mxfp4.BLOCK,
        "layout": LAYOUT,
        "units": {u: src.unit_file(u) for u in src.units},
    }


def quantization_config(plan: dict) -> dict:
    return {
        "quant_method": "mxfp4",
        "scale_mode": plan["scale_mode"],
        "block_size": plan["block_size"],
        "element_dtype": "e2m1",
        "scale_dtype": "e8m0",
        "rounding": "nearest, ties to even; saturate to 6",
        "modules": MODULES,
        "layout": LAYOUT_TEXT,
        "source_index_sha256": plan["source_index_sha256"],
        "converter": plan["converter"],
    }


def _plan_mismatch(have: dict, want: dict) -> str | None:
    for key in ("format", "source_index_sha256", "scale_mode", "block_size", "layout", "units"):
        if have.get(key) != want.get(key):
            return f"{key} {have.get(key)!r} there, {want.get(key)!r} for this run"
    return None


def unit_state(src: Source, dest: Dest, plan: dict, unit: str) -> str | None:
    """None when the unit is finished and still matches the source; else why not."""
    path = dest.record_path(unit)
    if not os.path.isfile(path):
        return "not converted"
    rec = load(path)
    if rec.get("fingerprint") != src.fingerprint(unit) or rec.get("source_index_sha256") != plan["source_index_sha256"]:
        return "stale: the source shards changed since it was converted"
    if rec.get("scale_mode") != plan["scale_mode"] or rec.get("file") != plan["units"][unit]:
        return "stale: converted under another plan"
    out = dest.path(rec["file"])
    if not os.path.isfile(out) or os.path.getsize(out) != rec["output_size"]:
        return f"stale: {out} is missing or not the size recorded"
    return None


class Worker:
    """One worker: claims its units in DST, converts those not finished, records each."""

    def __init__(
        self,
        src: Source,
        dest: Dest,
        mode: str,
        worker_id: str,
        units: list[str],
        quiet: bool = False,
        position: int = 0,
    ):
        self.src, self.dest, self.mode, self.id, self.units = src, dest, mode, worker_id, units
        self.quiet, self.position = quiet, position
        self.plan = make_plan(src, mode)
        self.created: list[str] = []  # paths this run created, for the roll-back on refused data

    def _mkdir(self, path: str) -> None:
        if not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            self.created.append(path)

    def check_dest(self) -> None:
        foreign = self.dest.foreign_content()
        if foreign:
            raise InputError(
                f"{self.dest.root}: holds {foreign[:3]}{'...' if len(foreign) > 3 else ''}, "
                "which is not a conversion by this tool; choose an empty or new DST"
            )
        have = self.dest.existing_plan()
        if have is not None:
            why = _plan_mismatch(have, self.plan)
            if why:
                raise InputError(f"{self.dest.plan_path}: DST already holds another conversion ({why})")

    def claim(self) -> int:
        self.check_dest()
        self._mkdir(self.dest.root)
        for sub in ("", "units", "claims"):
            self._mkdir(os.path.join(self.dest.state, sub))
        lock = os.path.join(self.dest.state, "lock")
        if not os.path.exists(lock):
            self.created.append(lock)
        with self.dest.locked():
            have = self.dest.existing_plan()
            if have is None and self.dest.create_plan(self.plan):
                self.created.append(self.dest.plan_path)
            elif have is not None:
                why = _plan_mismatch(have, self.plan)
                if why:
                    raise InputError(f"{self.dest.plan_path}: DST already holds another conversion ({why})")
            mine = set(self.units)
            for other, units in self.dest.claims().items():
                if other == self.id:
                    if set(units) != mine:
                        raise InputError(f"{self.dest.claim_path(other)}: claims {units}, not {sorted(mine)}")
                    continue
                common = sorted(mine & set(units))
                if common:
                    raise InputError(
                        f"{self.dest.claim_path(other)}: worker {other} already owns {common}; "
                        f"worker {self.id} overlaps it (two workers never write the same file)"
                    )
            path = self.dest.claim_path(self.id)
            if not os.path.isfile(path):
                write_atomic(path, dump({"worker": self.id, "units": self.units}), f"claim {self.id}")
                self.created.append(path)
        fd = os.open(self.dest.claim_path(self.id), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(
                f"{self.dest.claim_path(self.id)}: another process is running worker {self.id} now"
            ) from None
        return fd

    def run(self) -> list[str]:
        fd = self.claim()
        try:
            pending = [u for u in self.units if unit_state(self.src, self.dest, self.plan, u) is not None]
            total = sum(self.src.unit_bytes(u) for u in pending)
            ntensors = sum(len(self.src.unit_tensors(u)) for u in pending)
            progress = Progress(self.id, total, ntensors, quiet=self.quiet, position=self.position)
            try:
                for unit in pending:
                    self._one(unit, progress)
            except InputError:
                self._roll_back()
                raise
            finally:
                progress.close()
            return pending
        finally:
            os.close(fd)

    def _one(self, unit: str, progress: Progress) -> None:
        out = self.dest.path(self.plan["units"][unit])
        existed = os.path.exists(out)
        rec = convert_unit(self.src, unit, out, self.mode, progress)
        if not existed:
            self.created.append(out)
        rec.update(
            {
                "unit": unit,
                "file": self.plan["units"][unit],
                "scale_mode": self.mode,
                "source_index_sha256": self.src.index_sha256,
                "fingerprint": self.src.fingerprint(unit),
            }
        )
        path = self.dest.record_path(unit)
        existed = os.path.exists(path)
        write_atomic(path, dump(rec), f"{unit}: record")
        if not existed:
            self.created.append(path)

    def _roll_back(self) -> None:
        for path in reversed(self.created):
            try:
                if os.path.isdir(path):
                    os.rmdir(path)  # only if empty: another worker's files stay
                else:
                    os.unlink(path)
            except OSError:
                pass


def finalize(src: Source, dest: Dest, mode: str | None = None) -> dict:
    plan = dest.existing_plan()
    if plan is None:
        raise InputError(f"{dest.plan_path}: missing; DST holds no conversion yet (run the workers first)")
    if mode is not None and mode != plan["scale_mode"]:
        raise InputError(f"{dest.plan_path}: DST was converted with --scale-mode {plan['scale_mode']}, not {mode}")
    why = _plan_mismatch(plan, make_plan(src, plan["scale_mode"]))
    if why:
        raise InputError(f"{dest.plan_path}: DST is a conversion of another source or plan ({why})")
    problems = [(u, s) for u in src.units if (s := unit_state(src, dest, plan, u)) is not None]
    if problems:
        listed = "; ".join(f"{u}: {s}" for u, s in problems[:5])
        raise InputError(
            f"{dest.root}: {len(problems)} of {len(src.units)} units are not finished ({listed}"
            f"{'; ...' if len(problems) > 5 else ''}); run their workers, then --finalize again"
        )
    weight_map: dict[str, str] = {}
    total = 0
    for unit in src.units:
        rec = load(dest.record_path(unit))
        for name in rec["outputs"]:
            if name in weight_map:
                raise InputError(f"{dest.record_path(unit)}: tensor {name} is also in {weight_map[name]}")
            weight_map[name] = rec["file"]
        total += rec["data_bytes"]
    expected = {s.name for s in out_specs(list(src.tensors.values()))}
    if set(weight_map) != expected:
        diff = sorted(set(weight_map) ^ expected)
        raise InputError(f"{dest.root}: the unit records do not cover the source exactly (first: {diff[0]})")
    config = dict(src.config)
    config["quantization_config"] = quantization_config(plan)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    for name in sorted(os.listdir(src.root)):
        path = os.path.join(src.root, name)
        if COPIED_FILES.match(name) and os.path.isfile(path):
            with open(path, "rb") as f:
                write_atomic(dest.path(name), f.read(), f"finalize: {name}")
    write_atomic(dest.path("config.json"), dump(config), "finalize: config.json")
    write_atomic(dest.path(INDEX), dump(index), f"finalize: {INDEX}")
    return index


def _read(fd: int, entry: st.Entry) -> bytes:
    return os.pread(fd, entry.nbytes, entry.begin) if entry.nbytes else b""


def _hash(fd: int, entry: st.Entry) -> bytes:
    """blake3 of a tensor's bytes, read in chunks (a copied tensor may be GBs: the embeddings)."""
    import blake3

    h = blake3.blake3()
    pos = entry.begin
    while pos < entry.end:
        chunk = os.pread(fd, min(CHUNK, entry.end - pos), pos)
        if not chunk:
            raise OSError(f"short read at offset {pos}")
        h.update(chunk)
        pos += len(chunk)
    return h.digest()


def verify(src: Source, dest: Dest, sample: int | None = None, quiet: bool = False) -> dict:
    """Re-read DST against SRC. Copied tensors: equal bytes. Quantized: equal to a re-quantization
    of the source (every one, or `sample` per output file, evenly spaced)."""
    plan = dest.existing_plan()
    if plan is None:
        raise VerifyError(f"{dest.plan_path}: missing; DST is not a conversion")
    why = _plan_mismatch(plan, make_plan(src, plan["scale_mode"]))
    if why:
        raise VerifyError(f"{dest.plan_path}: DST is a conversion of another source or plan ({why})")
    index_path = dest.path(INDEX)
    if not os.path.isfile(index_path):
        raise VerifyError(f"{index_path}: missing (run --finalize)")
    index = load(index_path)
    config = load(dest.path("config.json"))
    if config.get("quantization_config") != quantization_config(plan):
        raise VerifyError(f"{dest.path('config.json')}: quantization_config differs from the plan")
    src_config = {k: v for k, v in config.items() if k != "quantization_config"}
    if src_config != src.config:
        raise VerifyError(f"{dest.path('config.json')}: differs from the source config.json beyond quantization_config")
    tensors = list(src.tensors.values())
    specs = {s.name: s for s in out_specs(tensors)}
    weight_map = index["weight_map"]
    if set(weight_map) != set(specs):
        diff = sorted(set(weight_map) ^ set(specs))
        raise VerifyError(
            f"{index_path}: names {len(weight_map)} tensors, the source makes {len(specs)} (first difference: {diff[0]})"
        )
    by_file: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        by_file.setdefault(file, []).append(name)
    headers = {}
    total = 0
    for file, names in sorted(by_file.items()):
        path = dest.path(file)
        if not os.path.isfile(path):
            raise VerifyError(f"{index_path}: names {file}, which is missing")
        h = st.read_header(path)
        if set(h.entries) != set(names):
            raise VerifyError(f"{path}: holds {len(h.entries)} tensors, the index assigns it {len(names)}")
        for name in names:
            e, s = h.entries[name], specs[name]
            if (e.dtype, e.shape) != (s.dtype, s.shape):
                raise VerifyError(
                    f"{path}: tensor {name} is {e.dtype}{list(e.shape)}, expected {s.dtype}{list(s.shape)}"
                )
            total += e.nbytes
        headers[file] = h
    if index.get("metadata", {}).get("total_size") != total:
        raise VerifyError(f"{index_path}: total_size {index.get('metadata', {}).get('total_size')} != {total}")
    for name in os.listdir(src.root):
        if COPIED_FILES.match(name) and not os.path.isfile(dest.path(name)):
            raise VerifyError(f"{dest.root}: {name} of the source was not copied")
    checked = {"copied": 0, "quantized": 0, "quantized_skipped": 0}
    fds: dict[str, int] = {}
    mismatches: list[str] = []
    progress = Progress("verify", sum(t.entry.nbytes for t in tensors), len(tensors), quiet=quiet)
    try:
        for file in sorted(headers):
            out_h = headers[file]
            mine = [t for t in tensors if weight_map[t.name] == file]
            quant = [t for t in mine if t.quantized]
            chosen = set(t.name for t in quant)
            if sample is not None and len(quant) > sample:
                step = len(quant) / sample
                chosen = {quant[int(i * step)].name for i in range(sample)}
            fo = os.open(out_h.path, os.O_RDONLY)
            try:
                for t in mine:
                    fs = fds.get(t.shard) or fds.setdefault(t.shard, os.open(src.headers[t.shard].path, os.O_RDONLY))
                    if not t.quantized:
                        a = _hash(fs, t.entry)
                        b = _hash(fo, out_h.entries[t.name])
                        checked["copied"] += 1
                        if a != b:
                            mismatches.append(f"{out_h.path}: tensor {t.name} differs from the source")
                    elif t.name in chosen:
                        q, scales = mxfp4.quantize(
                            mxfp4.as_bf16_bits(_read(fs, t.entry)).reshape(t.entry.shape), plan["scale_mode"]
                        )
                        checked["quantized"] += 1
                        if q.tobytes() != _read(fo, out_h.entries[t.name]):
                            mismatches.append(f"{out_h.path}: tensor {t.name} is not the re-quantization of the source")
                        if scales.tobytes() != _read(fo, out_h.entries[t.name + "_scale"]):
                            mismatches.append(
                                f"{out_h.path}: tensor {t.name}_scale is not the re-quantization of the source"
                            )
                    else:
                        checked["quantized_skipped"] += 1
                    progress.advance(t.entry.nbytes, 1)
            finally:
                os.close(fo)
    finally:
        for fd in fds.values():
            os.close(fd)
        progress.close()
    if mismatches:
        raise VerifyError(
            "; ".join(mismatches[:5]) + (f"; and {len(mismatches) - 5} more" if len(mismatches) > 5 else "")
        )
    return checked


# ---- command line --------------------------------------------------------------------------------
def _layers(text: str) -> tuple[int, int]:
    try:
        a, b = text.split(":")
        return int(a), int(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers takes A:B (layers A to B-1), got {text!r}") from None


def _task_index(value: str, count: int | None) -> tuple[int, int]:
    if value == "auto":
        for var in TASK_INDEX_ENV:
            if os.environ.get(var, "") != "":
                raw = os.environ[var]
                break
        else:
            raise InputError(f"--task-index auto: neither {' nor '.join(TASK_INDEX_ENV)} is set")
        try:
            index = int(raw) - (int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0")) if var.startswith("SLURM") else 0)
        except ValueError:
            raise InputError(f"--task-index auto: {var}={raw!r} is not an integer") from None
        if count is None and var.startswith("SLURM") and os.environ.get("SLURM_ARRAY_TASK_COUNT"):
            count = int(os.environ["SLURM_ARRAY_TASK_COUNT"])
    else:
        try:
            index = int(value)
        except ValueError:
            raise InputError(f"--task-index takes an integer or auto, got {value!r}") from None
    if count is None:
        raise InputError("--task-index needs --task-count N")
    if not 0 <= index < count:
        raise InputError(f"--task-index {index}: must be in 0..{count - 1} (--task-count {count})")
    return index, count


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m glm5_mxfp4.convert",
        description="BF16 glm_moe_dsa checkpoint -> MXFP4 routed experts (everything else unchanged).",
        epilog="Also: python -m glm5_mxfp4.convert verify SRC DST [--sample N] re-reads DST against SRC. "
        "Without a mode option the whole plan runs here (as --workers 1), then --finalize.",
    )
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--layers", type=_layers, metavar="A:B", help="one worker for layers A..B-1")
    g.add_argument("--other", action="store_true", help="the worker for every tensor outside the decoder layers")
    g.add_argument(
        "--finalize", action="store_true", help="write the index and config, copy tokenizer files and LICENSE"
    )
    g.add_argument(
        "--workers", type=int, metavar="N", help="the whole plan here as N processes, then finalize (default 1)"
    )
    g.add_argument(
        "--task-index", metavar="I|auto", help=f"task I of --task-count N; auto reads {' or '.join(TASK_INDEX_ENV)}"
    )
    p.add_argument("--task-count", type=int, metavar="N")
    p.add_argument(
        "--scale-mode",
        choices=mxfp4.SCALE_MODES,
        default=None,
        help=f"E8M0 scale rule (default {DEFAULT_MODE}; see the README for the measured error)",
    )
    p.add_argument("--quiet", action="store_true")
    return p


def _verify_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m glm5_mxfp4.convert verify", description="Re-read DST against SRC.")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")
    p.add_argument(
        "--sample", type=int, metavar="N", help="re-quantize N routed-expert tensors per output file (default: all)"
    )
    p.add_argument("--quiet", action="store_true")
    return p


def _run_workers(args, src: Source, dest: Dest, mode: str) -> None:
    n = args.workers or 1
    tasks = src.tasks(n)
    if n == 1:
        Worker(src, dest, mode, "task-0-of-1", tasks[0], quiet=args.quiet).run()
        return
    existed = os.path.exists(dest.root)
    Worker(src, dest, mode, "check", []).check_dest()  # refuse before starting anything
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("NUMBA_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    procs = []
    for i in range(n):
        cmd = [
            sys.executable,
            "-m",
            "glm5_mxfp4.convert",
            src.root,
            dest.root,
            "--task-index",
            str(i),
            "--task-count",
            str(n),
            "--scale-mode",
            mode,
        ] + (["--quiet"] if args.quiet else [])
        procs.append(subprocess.Popen(cmd, env=dict(env, GLM5_MXFP4_POSITION=str(i))))
    failed = []
    for i, proc in enumerate(procs):
        if proc.wait() != 0:
            failed.append((i, proc.returncode))
            for other in procs:
                if other.poll() is None:
                    other.send_signal(signal.SIGTERM)
    if failed:
        for proc in procs:
            proc.wait()
        if not existed and os.path.exists(dest.root):
            shutil.rmtree(dest.root)
            kept = f"{dest.root} removed (this run created it)"
        else:
            kept = "finished units are kept; rerunning resumes"
        raise InputError(f"worker task {failed[0][0]} of {n} exited {failed[0][1]}; {kept}")


def _threading_layer() -> None:
    """numba's OpenMP layer keeps its threads spinning between kernel calls (one call per expert
    tensor), which costs a fifth of the converter's CPU time on a busy 2-core machine; the
    workqueue layer does not. Only one thread calls the kernel, which workqueue requires."""
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "workqueue"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "verify":
            args = _verify_parser().parse_args(argv[1:])
            src = Source(args.src)
            checked = verify(src, Dest(args.dst), args.sample, args.quiet)
            if not args.quiet:
                print(
                    f"verified {args.dst}: {checked['copied']} copied tensors equal to the source, "
                    f"{checked['quantized']} routed-expert tensors equal to a re-quantization"
                    + (f" ({checked['quantized_skipped']} not sampled)" if checked["quantized_skipped"] else "")
                )
            return 0
        args = _parser().parse_args(argv)
        src = Source(args.src)
        dest = Dest(args.dst)
        if args.finalize:
            index = finalize(src, dest, args.scale_mode)
            if not args.quiet:
                print(
                    f"finalized {dest.root}: {len(index['weight_map'])} tensors, "
                    f"{index['metadata']['total_size'] / 1e9:.3f} GB"
                )
            return 0
        mode = args.scale_mode or (dest.existing_plan() or {}).get("scale_mode") or DEFAULT_MODE
        position = int(os.environ.get("GLM5_MXFP4_POSITION", "0"))
        if args.layers is not None:
            a, b = args.layers
            Worker(src, dest, mode, f"layers-{a}-{b}", src.layer_units(a, b), args.quiet, position).run()
        elif args.other:
            Worker(src, dest, mode, "other", ["other"], args.quiet, position).run()
        elif args.task_index is not None:
            i, n = _task_index(args.task_index, args.task_count)
            Worker(src, dest, mode, f"task-{i}-of-{n}", src.tasks(n)[i], args.quiet, position).run()
        else:
            if args.task_count is not None:
                raise InputError("--task-count goes with --task-index")
            _run_workers(args, src, dest, mode)
            index = finalize(src, dest, mode)
            if not args.quiet:
                print(
                    f"converted {src.root} -> {dest.root}: {len(index['weight_map'])} tensors, "
                    f"{index['metadata']['total_size'] / 1e9:.3f} GB, scale mode {mode}"
                )
        return 0
    except InputError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    except VerifyError as exc:
        print(f"verify FAILED: {exc}", file=sys.stderr)
        return 3


def cli() -> int:
    """The command (`python -m glm5_mxfp4.convert`, `glm5-mxfp4-convert`): main in a process of its own."""
    _threading_layer()
    return main()


if __name__ == "__main__":
    sys.exit(cli())
