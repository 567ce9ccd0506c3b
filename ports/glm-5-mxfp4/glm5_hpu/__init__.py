"""GLM-5.3 (glm_moe_dsa) with MXFP4 routed experts, written for the Gaudi port: the PyTorch
reference path, on CPU.

``switches.py``   the GLM_* switches, parsed from port.yaml (the one declaration)
``moe_mxfp4.py``  MXFP4 expert storage, on-the-fly dequantization, the router and the MoE forward
``dsa.py``        DSA: the indexer's top-k selection and sparse attention above a key threshold
``placement.py``  the expert placement file (GLM_MOE_PLACEMENT): a checked permutation

Not here yet: the vLLM model and its plugin entry point (see the port README).
"""

__all__ = ["dsa", "moe_mxfp4", "placement", "switches"]
