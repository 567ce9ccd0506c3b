"""decode: single-stream decode speed at each prompt length, every shape warmed once."""

from __future__ import annotations

import time

from .client import Client, GateError, Result
from .documents import kilo, sized_document


def timed_completion(client: Client, prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    """Stream one completion: time to the first token, first and last token arrival, tokens."""
    body = {
        "model": client.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = last = None
    chunks, usage = 0, None
    for t, ev in client.stream("/v1/completions", body):
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices") or []:
            if ch.get("text"):
                chunks += 1
                first = first if first is not None else t
                last = t
    if first is None:
        raise GateError("the stream carried no tokens")
    tokens = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
    return {"ttft_s": first - t0, "first": first, "last": last, "tokens": tokens, "chunks": chunks}


def gate_decode(client: Client, opts) -> Result:
    details, figures, ok = {}, [], True
    # strict=False: the two command-line lists pair up to the shorter, as they always have
    for length, floor in zip(opts.decode_lengths, opts.decode_floors, strict=False):
        warm, _, _ = sized_document(client, length, seed=10_000 + length)
        timed_completion(client, warm, opts.decode_tokens, True)  # compiles this shape
        prompt, tokens, counted = sized_document(client, length, seed=20_000 + length)
        m = timed_completion(client, prompt, opts.decode_tokens, True)
        span = m["last"] - m["first"]
        if m["tokens"] < 2 or span <= 0:
            raise GateError(f"decode at {length}: {m['tokens']} tokens in {span:.3f} s; cannot time decode")
        rate = (m["tokens"] - 1) / span
        passed = rate >= floor
        ok &= passed
        label = ("" if counted else "~") + kilo(tokens)
        figures.append(f"{label} {rate:.1f} tok/s (floor {floor:g})")
        details[label] = {
            "prompt_tokens": tokens,
            "decode_tokens": m["tokens"],
            "seconds": round(span, 3),
            "tokens_per_s": round(rate, 2),
            "floor": floor,
            "pass": passed,
        }
    return Result("decode", "pass" if ok else "fail", "; ".join(figures), details)
