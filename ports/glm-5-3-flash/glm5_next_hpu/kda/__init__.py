"""Kimi Delta Attention (KDA) with GLM's bounded gate, flash-linear-attention layout.

``naive``      float64 token-by-token recurrence, the test oracle
``chunk``      chunked prefill (chunk 64, anchored exponents, blocked inverse)
``scan``       the affine carry between chunks (Hillis-Steele or sequential)
``recurrent``  the decode step with fp32 state
``gate``/``conv``  the bounded sigmoid gate and the short causal conv with state
"""

from .chunk import chunk_kda
from .conv import causal_conv1d, causal_conv1d_update
from .gate import kda_gate, l2norm
from .naive import naive_recurrent_kda
from .recurrent import fused_recurrent_kda
from .scan import affine_scan, sequential_affine_scan

__all__ = [
    "affine_scan",
    "causal_conv1d",
    "causal_conv1d_update",
    "chunk_kda",
    "fused_recurrent_kda",
    "kda_gate",
    "l2norm",
    "naive_recurrent_kda",
    "sequential_affine_scan",
]
