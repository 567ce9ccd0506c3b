"""Device gates of the GLM-5.3-Flash port, one module per gate (see driver.py for the list).

Run as a package: `python -m gates` from tests/hpu, or through run_gates.sh. The names below
are what the CPU tests of the client (tests/test_gates_client.py) reach.
"""

from .client import Client, GateError, Result, run_script, table
from .decode import gate_decode, timed_completion
from .documents import filler_sentences, kilo, sized_document
from .driver import ALL_GATES, GATES, SERVER_GATES, build_parser, main, run_gates
from .fixes import device_gates, gate_fix_scripts
from .fp8 import REFERENCE_FP8_IDS, gate_fp8
from .golden import completion_ids, gate_golden, load_golden
from .images import COLOURS, QUADRANTS, gate_images, image_cases, judge_image, quadrants, solid, squares
from .needles import DOORS, gate_needles, needle_code, needle_sentence
from .prefill import gate_prefill
from .sinkhorn import gate_sinkhorn, sinkhorn_command
from .tools import gate_tools

__all__ = [
    "Client",
    "GateError",
    "Result",
    "run_script",
    "table",
    "gate_decode",
    "timed_completion",
    "filler_sentences",
    "kilo",
    "sized_document",
    "ALL_GATES",
    "GATES",
    "SERVER_GATES",
    "build_parser",
    "main",
    "run_gates",
    "device_gates",
    "gate_fix_scripts",
    "REFERENCE_FP8_IDS",
    "gate_fp8",
    "completion_ids",
    "gate_golden",
    "load_golden",
    "COLOURS",
    "QUADRANTS",
    "gate_images",
    "image_cases",
    "judge_image",
    "quadrants",
    "solid",
    "squares",
    "DOORS",
    "gate_needles",
    "needle_code",
    "needle_sentence",
    "gate_prefill",
    "gate_sinkhorn",
    "sinkhorn_command",
    "gate_tools",
]
