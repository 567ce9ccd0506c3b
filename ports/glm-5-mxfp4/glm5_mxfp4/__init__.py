"""GLM-5.3 (glm_moe_dsa) BF16 checkpoint -> MXFP4 routed experts: the quantizer and the converter."""

__version__ = "0.1.0"
