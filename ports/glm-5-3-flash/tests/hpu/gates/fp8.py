"""fp8: the block-FP8 checkpoint's forward on a card -- vLLM's FP8 linear method (vllm-gaudi's HPU
block-FP8 ops) in the MLA projections, the dense MLP and the shared expert, the routed experts
dequantized in the port's loop. Run against a server that serves the FP8 checkpoint: the golden
prompts, greedy, against token ids measured on a card from that checkpoint
(golden/reference_fp8_ids.json). "not measured" while that file is absent, or when the server
serves another model than the one the file was measured on; --record-fp8 PATH writes the ids."""

from __future__ import annotations

from .client import Client, Result
from .golden import golden_against

REFERENCE_FP8_IDS = "reference_fp8_ids.json"


def gate_fp8(client: Client, opts) -> Result:
    return golden_against(client, opts, "fp8", REFERENCE_FP8_IDS, opts.record_fp8, same_model=True)
