"""Label the emulation's counters with what vllm-gaudi's runner is doing.

The emulation counts per step and per purpose; which step is a prefill or a decode, and which
allocations are weights or KV cache, is known only to the runner. These wrappers around
``HPUModelRunner`` methods say so. Harness code, used in the process that runs the model.
"""

from __future__ import annotations

import functools

from hpu_emulation import counting, memory


def _wrap(cls, name, around):
    original = getattr(cls, name)
    if getattr(original, "__hpu_harness__", False):
        return

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        with around(self, args, kwargs):
            return original(self, *args, **kwargs)

    wrapper.__hpu_harness__ = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapper)


def _step(self, args, kwargs):
    attn_metadata = kwargs.get("attn_metadata", args[2] if len(args) > 2 else None)
    token_ids = kwargs.get("token_ids", args[0] if args else None)
    phase = "prefill" if getattr(attn_metadata, "is_prompt", False) else "decode"
    shape = "x".join(str(d) for d in getattr(token_ids, "shape", ()))
    warm = " (warmup)" if kwargs.get("warmup_mode") else ""
    return counting.step(f"{phase} {shape}{warm}")


def _phase(label):
    # the host-side phases around the forward (sampling with rejection, drafting): their host
    # synchronisations are counted as a step of their own, outside any captured region
    return lambda self, args, kwargs: counting.step(label)


def instrument_runner(phases: bool = False) -> None:
    """``phases``: also count sampling (``sample_tokens``), drafting (``propose_draft_token_ids``) and
    the engine's fetch of the drafts after the step (``take_draft_token_ids``) as steps of their own
    ("sample", "draft", "take drafts")."""
    from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner

    _wrap(HPUModelRunner, "_execute_model_generic", _step)
    phase_methods = (
        ("sample_tokens", "sample"),
        ("propose_draft_token_ids", "draft"),
        ("take_draft_token_ids", "take drafts"),
    )
    for name, label in phase_methods if phases else ():
        if hasattr(HPUModelRunner, name):
            _wrap(HPUModelRunner, name, _phase(label))
    _wrap(HPUModelRunner, "load_model", lambda self, a, k: memory.purpose("weights"))
    _wrap(HPUModelRunner, "initialize_kv_cache", lambda self, a, k: memory.purpose("kv_cache"))
