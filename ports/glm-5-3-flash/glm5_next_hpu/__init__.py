"""GLM-5.3-Flash (glm5_next) in plain PyTorch, written for the Gaudi port.

The model mirrors transformers 5.23.0 ``modeling_glm5_next.py`` block by block;
``kda/`` holds the KDA kernels, ``mhc.py`` the hyper-connections, ``weights.py``
the checkpoint-name mapping and ``config.py`` what the port can serve.
"""

__all__ = ["config", "kda", "mhc", "model", "register", "weights"]


def register() -> None:
    """vLLM general-plugin entry (also reachable as ``glm5_next_hpu.vllm_plugin:register``)."""
    from .vllm_plugin import register as _register

    _register()
