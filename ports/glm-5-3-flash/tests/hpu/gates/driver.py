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
gates are run and reported by fixpack's one gate runner (fixpack/gates/runner.py, which
gives the common options and the exit code: 1 when any gate fails or errors, with --strict
also when one is not measured or missing, else 0; 2 bad usage); this module declares the
gates and their options. Nothing here invents a number: figures are what this server answered.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fixpack.gates import runner

from .client import Result
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

# in the order they run; every one runs by default
GATES = {
    "golden": gate_golden,
    "fp8": gate_fp8,
    "needles": gate_needles,
    "tools": gate_tools,
    "images": gate_images,
    "decode": gate_decode,
    "prefill": gate_prefill,
    "sinkhorn": gate_sinkhorn,
    "fixes": gate_fix_scripts,
}
ALL_GATES = DEFAULT = list(GATES)
NO_SERVER = {"sinkhorn"}
SERVER_GATES = set(GATES) - NO_SERVER


def ints(text: str) -> list[int]:
    return [int(float(x[:-1]) * 1024) if x.lower().endswith("k") else int(x) for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def add_arguments(p) -> None:
    p.add_argument("--golden-dir", type=Path, default=GOLDEN_DIR)
    p.add_argument(
        "--record-golden", type=Path, metavar="PATH", help="write the golden token ids this server gives to PATH"
    )
    p.add_argument(
        "--record-fp8", type=Path, metavar="PATH", help="write the fp8 gate's token ids (an FP8 server) to PATH"
    )
    p.add_argument("--needle-lengths", type=ints, default=ints("16K,63K,127K,239K"))
    p.add_argument("--tool-doc-tokens", type=lambda x: ints(x)[0], default=32768)
    p.add_argument("--answer-tokens", type=int, default=1024, help="max_tokens of each answer (reasoning included)")
    p.add_argument(
        "--chat-kwargs",
        type=json.loads,
        default={"reasoning_effort": "low"},
        help="chat_template_kwargs for the answer gates (JSON)",
    )
    p.add_argument("--decode-lengths", type=ints, default=ints("2K,128K"))
    p.add_argument("--decode-floors", type=floats, default=floats("15,10"), help="tokens/s, one per decode length")
    p.add_argument("--decode-tokens", type=int, default=512)
    p.add_argument("--ttft-lengths", type=ints, default=ints("16K,64K,128K"))
    p.add_argument("--ttft-limit", type=float, default=120.0, help="seconds allowed at the longest TTFT length")
    p.add_argument("--sinkhorn-dir", type=Path, default=SINKHORN_DIR)
    p.add_argument("--sinkhorn-cmd", help="run this instead of looking in --sinkhorn-dir")
    p.add_argument(
        "--pack-root", type=Path, default=PACK_ROOT, help="the fix pack whose device gates the fixes gate runs"
    )
    p.add_argument("--script-timeout", type=float, default=3600.0)


def check(opts) -> str | None:
    if len(opts.decode_floors) != len(opts.decode_lengths):
        return "--decode-floors needs one floor per --decode-lengths entry"
    return None


def build_parser():
    return runner.parser(sys.modules[__name__])


def run_gates(opts) -> list[Result]:
    return runner.run_gates(sys.modules[__name__], opts)


def main(argv: list[str] | None = None) -> int:
    return runner.main(sys.modules[__name__], argv, prog="python -m gates")
