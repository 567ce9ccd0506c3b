"""Per-worker progress: a tqdm bar on a terminal, plain periodic lines otherwise, nothing with --quiet."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(
        self,
        label: str,
        total_bytes: int,
        total_tensors: int,
        quiet: bool = False,
        position: int = 0,
        every: float = 10.0,
        stream=None,
    ):
        self.label, self.total_bytes, self.total_tensors = label, total_bytes, total_tensors
        self.quiet, self.every = quiet, every
        self.stream = stream or sys.stderr
        self.bytes = self.tensors = 0
        self.start = self.last = time.monotonic()
        self.bar = None
        if not quiet and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                desc=label,
                position=position,
                file=self.stream,
                dynamic_ncols=True,
            )

    def advance(self, nbytes: int, ntensors: int) -> None:
        self.bytes += nbytes
        self.tensors += ntensors
        if self.bar is not None:
            self.bar.update(nbytes)
            self.bar.set_postfix_str(f"{self.tensors}/{self.total_tensors} tensors", refresh=False)
        elif not self.quiet and time.monotonic() - self.last >= self.every:
            self.line()

    def line(self, final: bool = False) -> None:
        now = time.monotonic()
        self.last = now
        rate = self.bytes / max(now - self.start, 1e-9)
        left = (self.total_bytes - self.bytes) / rate if rate > 0 else float("inf")
        eta = "done" if final else (f"ETA {left:.0f} s" if left != float("inf") else "ETA ?")
        print(
            f"[{self.label}] {self.bytes / 1e9:.2f}/{self.total_bytes / 1e9:.2f} GB, "
            f"{self.tensors}/{self.total_tensors} tensors, {rate / 1e9:.2f} GB/s, {eta}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif not self.quiet:
            self.line(final=True)
