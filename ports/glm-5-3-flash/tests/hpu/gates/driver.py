"""Device gates for a running GLM-5.3-Flash server (OpenAI API over HTTP, standard library only).

    python -m gates --base-url http://127.0.0.1:8000 [--only golden,needles,...] [--json out.json]

Gates, in the order they run:
  golden    greedy prompts (golden/prompts.json) against token ids measured on a card
            (golden/reference_ids.json). Without that file the gate is "not measured";
            --record-golden PATH writes the ids this server gives, for a person to review.
  fp8       the block-FP8 checkpoint's forward (vLLM's FP8 linear method on the card): the
            golden prompts against golden/reference_fp8_ids.json, measured on a card from the
            FP8 checkpoint; "not measured" without it or when the server serves another model;
            --record-fp8 PATH writes the ids.
  needles   three codes at 10, 50 and 90 % depth of a filler document, one question each,
            at every --needle-lengths (tokens, counted by the server's /tokenize)
  tools     single, parallel and no call, each streamed and not; multi-turn; a call after a
            32K-token document
  images    three solid colours, quadrants, counting, text before and after the image;
            five images must be rejected with HTTP 400
  decode    single-stream decode at 2K and 128K prompts, 512 tokens with ignore_eos, timed
            from the first to the last streamed token, every shape warmed once; floors
  prefill   warm TTFT at 16K, 64K and 128K prompts; the longest must come within its limit
  sinkhorn  the Sinkhorn TPC kernel's own device test (ports/glm-5-3-flash/kernels/sinkhorn/)
  fixes     the fix pack's device gates: every device_gate.py of a fix folder (fixes/<id>/,
            ports/<port>/fixes/<id>/) and of gates/<name>/ (see gates/README.md at the root)

Results are "pass", "fail", "error" (the gate could not run: a request failed, a reply was
malformed), "not measured" (no reference yet) or "missing" (the script is not there). The
exit code is 1 when any gate fails or errors (with --strict also when one is not measured or
missing), else 0. Nothing here invents a number: figures are what this server answered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .client import Client, GateError, Result, table
from .decode import gate_decode
from .fixes import gate_fix_scripts
from .fp8 import gate_fp8
from .golden import gate_golden
from .images import gate_images
from .needles import gate_needles
from .prefill import gate_prefill
from .sinkhorn import gate_sinkhorn
from .tools import gate_tools

HERE = Path(__file__).resolve().parent.parent  # tests/hpu
PORT_DIR = HERE.parents[1]
PACK_ROOT = PORT_DIR.parents[1]
GOLDEN_DIR = HERE / "golden"
SINKHORN_DIR = PORT_DIR / "kernels" / "sinkhorn"

ALL_GATES = ["golden", "fp8", "needles", "tools", "images", "decode", "prefill", "sinkhorn", "fixes"]


GATES = {
    "golden": gate_golden,
    "fp8": gate_fp8,
    "needles": gate_needles,
    "tools": gate_tools,
    "images": gate_images,
    "decode": gate_decode,
    "prefill": gate_prefill,
    "sinkhorn": gate_sinkhorn,
}
SERVER_GATES = {"golden", "fp8", "needles", "tools", "images", "decode", "prefill", "fixes"}


def ints(text: str) -> list[int]:
    return [int(float(x[:-1]) * 1024) if x.lower().endswith("k") else int(x) for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=os.environ.get("GATE_BASE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", help="model id (default: the first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--only", help=f"comma-separated gates (default: all of {', '.join(ALL_GATES)})")
    p.add_argument("--json", type=Path, help="write the results here as JSON")
    p.add_argument("--strict", action="store_true", help="'not measured' and 'missing' fail too")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    p.add_argument("--golden-dir", type=Path, default=GOLDEN_DIR)
    p.add_argument("--record-golden", type=Path, metavar="PATH", help="write the golden token ids this server gives to PATH")
    p.add_argument("--record-fp8", type=Path, metavar="PATH", help="write the fp8 gate's token ids (an FP8 server) to PATH")
    p.add_argument("--needle-lengths", type=ints, default=ints("16K,63K,127K,239K"))
    p.add_argument("--tool-doc-tokens", type=lambda x: ints(x)[0], default=32768)
    p.add_argument("--answer-tokens", type=int, default=1024, help="max_tokens of each answer (reasoning included)")
    p.add_argument("--chat-kwargs", type=json.loads, default={"reasoning_effort": "low"}, help="chat_template_kwargs for the answer gates (JSON)")
    p.add_argument("--decode-lengths", type=ints, default=ints("2K,128K"))
    p.add_argument("--decode-floors", type=floats, default=floats("15,10"), help="tokens/s, one per decode length")
    p.add_argument("--decode-tokens", type=int, default=512)
    p.add_argument("--ttft-lengths", type=ints, default=ints("16K,64K,128K"))
    p.add_argument("--ttft-limit", type=float, default=120.0, help="seconds allowed at the longest TTFT length")
    p.add_argument("--sinkhorn-dir", type=Path, default=SINKHORN_DIR)
    p.add_argument("--sinkhorn-cmd", help="run this instead of looking in --sinkhorn-dir")
    p.add_argument("--pack-root", type=Path, default=PACK_ROOT, help="the fix pack whose device gates the fixes gate runs")
    p.add_argument("--script-timeout", type=float, default=3600.0)
    return p


def run_gates(opts) -> list[Result]:
    names = [g.strip() for g in opts.only.split(",")] if opts.only else list(ALL_GATES)
    unknown = [g for g in names if g not in ALL_GATES]
    if unknown:
        raise SystemExit(f"gates: unknown gate(s) {', '.join(unknown)}; known: {', '.join(ALL_GATES)}")
    if len(opts.decode_floors) != len(opts.decode_lengths):
        raise SystemExit("gates: --decode-floors needs one floor per --decode-lengths entry")
    client = Client(opts.base_url, opts.model, opts.timeout, opts.api_key) if SERVER_GATES & set(names) else None
    results: list[Result] = []
    for name in names:
        t0 = time.perf_counter()
        try:
            if name == "fixes":
                got = gate_fix_scripts(client, opts)
            else:
                got = [GATES[name](client, opts)]
        except GateError as exc:
            got = [Result(name, "error", str(exc)[:200], {"error": str(exc)})]
        if client is not None and client._model is not None:
            opts.model = client._model
        for r in got:
            r.seconds = round(time.perf_counter() - t0, 1)
            results.append(r)
            print(f"{r.gate}: {r.result}  {r.figures}", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = run_gates(opts)
    print(table(results))
    if opts.json:
        opts.json.write_text(json.dumps({"server": opts.base_url, "model": opts.model, "started": started, "gates": [asdict(r) for r in results]}, indent=1) + "\n")
    bad = {"fail", "error"} | ({"not measured", "missing"} if opts.strict else set())
    return 1 if any(r.result in bad for r in results) else 0
