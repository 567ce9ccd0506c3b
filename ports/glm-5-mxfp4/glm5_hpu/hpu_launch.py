"""Which of the port's switches vllm-gaudi's runner can serve as asked (no vLLM import: the
check is tested without vLLM, and glm5_hpu/vllm_hpu.py runs it at engine start-up).

What the switches mean on this platform (port.yaml has the full meaning):

* ``GLM_DSA_SPARSE=1``: dense MLA (vllm-gaudi's, unchanged) while ``--max-model-len`` is at most
  the threshold (32,768 keys); above it the top-k of glm5_hpu/hpu_dsa.py as an attention bias on
  vllm-gaudi's MLA, each query that sees more than 32,768 keys attending to its ``index_topk``
  best-scored keys. Refused above the threshold where the config has "shared" indexer layers
  (reusing the previous layer's selection: not built). ``0``: dense MLA at every length, as
  vllm-gaudi serves DSA.
* ``GLM_MXK`` / ``GLM_MXK_PREFILL``: ``0`` = vllm-gaudi's stock MXFP4 MoE op; ``1`` (and auto,
  which means the kernels on HPU) = the GLM kernels for decode-sized / 256- to 4,096-token calls
  (glm5_hpu/hpu_mxk.py): their built library, or on the Habana emulation their operation order in
  PyTorch; refused where neither is there.
* ``GLM_MOE_TP=N`` > 1: the expert-group layout (glm5_hpu/vllm_hpu.py): the TP ranks form TP/N
  expert groups of N consecutive ranks, each holding its group's experts at 1/N of the
  intermediate dimension. Needs ``--enable-expert-parallel``, N dividing the TP size, no data
  parallelism, and an intermediate size that splits into N parts of whole 32-element blocks;
  anything else is refused.
* ``GLM_MOE_PLACEMENT=FILE``: the experts stored in the file's order (glm5_hpu/vllm_hpu.py); the
  file is read and checked at start-up (glm5_hpu/placement.py), a bad one refused.
* ``GLM_ROUTER_FAST=1``: vllm-gaudi's own routing (grouped top-k with the correction bias, on the
  device; the emulation counts no host synchronisation inside a decode step). ``0`` (the CPU
  reference routing) is not wired on HPU: refused.
* ``GLM_SPEC_DEVICE_REJECT=1``: greedy batches' rejection on the card (glm5_hpu/spec_device.py);
  0: vllm-gaudi's, which reads its inputs back to the host first.
* ``GLM_EARLY_DRAFT=1``: with MTP, a verify step's draft runs on the card from the rejection output
  before the step's tokens are read back, and both are read in one copy (glm5_hpu/early_draft.py);
  0: vLLM's drafting after the step. Nothing to do without speculative decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import placement
from .dsa import DENSE_UNTIL_KEYS
from .switches import Switches, resolve_auto

BLOCK = 32  # elements per MXFP4 block (one E8M0 scale): GLM_MOE_TP splits whole blocks only


def hpu_not_built(
    switches: Switches,
    *,
    max_model_len: int,
    speculative: bool,
    kernels_missing: str | None = None,
    threshold: int = DENSE_UNTIL_KEYS,
    shared_indexer_layers: Sequence[int] = (),
    tensor_parallel: int = 1,
    expert_parallel: bool = False,
    data_parallel: int = 1,
    hf_config=None,
) -> list[str]:
    """Each switch whose requested path vllm-gaudi's runner does not have with this port, as
    ``"GLM_X=v: why; set ..."``; empty when the launch can be served as asked. ``kernels_missing``:
    why the MXFP4 MoE kernels cannot run here (glm5_hpu/hpu_mxk.py ``kernels()``), None when they can.
    ``threshold``: the DSA threshold of this launch (glm5_hpu/hpu_dsa.py ``threshold``);
    ``shared_indexer_layers``: the layers whose config ``indexer_types`` entry is "shared";
    ``hf_config``: the model's config (its MoE intermediate size; a placement file is read and
    checked against it); None skips those two checks."""
    problems = []
    if switches.dsa_sparse and max_model_len > threshold and shared_indexer_layers:
        shown = ", ".join(str(i) for i in shared_indexer_layers[:8]) + (
            " ..." if len(shared_indexer_layers) > 8 else ""
        )
        problems.append(
            f'GLM_DSA_SPARSE=1 with --max-model-len {max_model_len}: the config\'s indexer_types has "shared" '
            f"layers ({shown}), which reuse the previous layer's top-k; that is not built on HPU. Use "
            f"--max-model-len <= {threshold} (dense MLA, exact there), or GLM_DSA_SPARSE=0 for dense attention at "
            "every length"
        )
    for name, value in (("GLM_MXK", switches.mxk), ("GLM_MXK_PREFILL", switches.mxk_prefill)):
        if resolve_auto(value, on_hpu=True) and kernels_missing is not None:
            shown = "auto (the kernels on HPU)" if value is None else "1"
            problems.append(f"{name}={shown}: {kernels_missing}; set {name}=0 for vllm-gaudi's stock MXFP4 MoE op")
    problems += _moe_tp_problems(switches.moe_tp, tensor_parallel, expert_parallel, data_parallel, hf_config)
    if switches.moe_placement is not None and hf_config is not None:
        try:
            placement.load(switches.moe_placement, hf_config)
        except placement.PlacementError as exc:
            problems.append(f"GLM_MOE_PLACEMENT={switches.moe_placement}: {exc}; fix the file or unset it")
    if not switches.router_fast:
        problems.append(
            "GLM_ROUTER_FAST=0: the reference routing is the CPU path's; on HPU the router is vllm-gaudi's "
            "(on the device): set GLM_ROUTER_FAST=1"
        )
    return problems


def _moe_tp_problems(n: int, tp: int, ep: bool, dp: int, hf_config) -> list[str]:
    if n == 1:
        return []
    at = f"GLM_MOE_TP={n}"
    fix = "or set GLM_MOE_TP=1 (whole experts per card)"
    problems = []
    if tp % n:
        problems.append(f"{at}: does not divide the tensor-parallel size {tp}; set a divisor of {tp} {fix}")
    if not ep:
        problems.append(f"{at}: the expert-group layout is expert parallelism: add --enable-expert-parallel {fix}")
    if dp != 1:
        problems.append(f"{at} with data-parallel size {dp}: the layout across data-parallel ranks is not built; {fix}")
    inter = getattr(hf_config, "moe_intermediate_size", None) if hf_config is not None else None
    if isinstance(inter, int) and inter % (n * BLOCK):
        problems.append(
            f"{at}: moe_intermediate_size {inter} does not split into {n} parts of whole {BLOCK}-element MXFP4 "
            f"blocks; {fix}"
        )
    return problems
