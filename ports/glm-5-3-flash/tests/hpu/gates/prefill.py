"""prefill: warm time to first token at each prompt length; the longest within its limit."""

from __future__ import annotations

from .client import Client, Result
from .decode import timed_completion
from .documents import kilo, sized_document


def gate_prefill(client: Client, opts) -> Result:
    details, figures, label = {}, [], ""
    for length in opts.ttft_lengths:
        warm, _, _ = sized_document(client, length, seed=30_000 + length)
        timed_completion(client, warm, 2, False)
        prompt, tokens, counted = sized_document(client, length, seed=40_000 + length)
        m = timed_completion(client, prompt, 2, False)
        label = ("" if counted else "~") + kilo(tokens)
        figures.append(f"{label} {m['ttft_s']:.1f} s")
        details[label] = {"prompt_tokens": tokens, "ttft_s": round(m["ttft_s"], 3)}
    longest = details[label]
    ok = longest["ttft_s"] <= opts.ttft_limit
    longest["limit_s"] = opts.ttft_limit
    return Result(
        "prefill",
        "pass" if ok else "fail",
        "; ".join(figures) + f" (limit {opts.ttft_limit:g} s at the longest)",
        details,
    )
