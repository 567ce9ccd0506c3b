"""GLM-5.3-Flash (glm5_next) in plain PyTorch, written for the Gaudi port.

``layers/``     the model's layers (norm, MoE, KDA layer, MLA + indexer, mHC parameters, vision)
``reference.py`` the parity model the tests compare with transformers 5.23.0 block by block
``vllm/``       the vLLM 0.26.0 model, loader and config check, built from the same layers
``kda/``        the KDA kernels; ``mhc.py`` the hyper-connection math
``switches.py`` the GLM5_NEXT_* switches, parsed from port.yaml
``weights.py``  checkpoint names; ``config.py`` what the port can serve
"""

__all__ = ["config", "kda", "layers", "mhc", "reference", "register", "switches", "weights"]


def register() -> None:
    """vLLM general-plugin entry (also reachable as ``glm5_next_hpu.vllm_plugin:register``)."""
    from .vllm_plugin import register as _register

    _register()
