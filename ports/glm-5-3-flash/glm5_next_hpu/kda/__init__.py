"""Kimi Delta Attention (KDA) with GLM's bounded gate, flash-linear-attention layout.

Every form takes the same leading arguments, ``(q, k, v, g, beta, scale=None,
initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False, mask=None)``,
and returns ``(o, final_state or None)``.

``naive``      the float64 oracles: the token-by-token recurrence and the plain chunk form
``chunk``      chunked prefill (chunk 64, anchored exponents, blocked inverse)
``scan``       the affine carry between chunks (Hillis-Steele or sequential)
``recurrent``  the decode step with fp32 state
``gate``       the bounded sigmoid gate and the gated RMSNorm on the output
``conv``       the short causal conv with state
``utils``      l2norm, the default scale, padding removal
"""

from .chunk import chunk_kda
from .conv import causal_conv1d, causal_conv1d_update
from .gate import gated_rms_norm, kda_gate
from .naive import naive_chunk_kda, naive_recurrent_kda
from .recurrent import fused_recurrent_kda
from .scan import affine_scan, default_use_scan, sequential_affine_scan
from .utils import l2norm

__all__ = [
    "affine_scan",
    "causal_conv1d",
    "causal_conv1d_update",
    "chunk_kda",
    "default_use_scan",
    "fused_recurrent_kda",
    "gated_rms_norm",
    "kda_gate",
    "l2norm",
    "naive_chunk_kda",
    "naive_recurrent_kda",
    "sequential_affine_scan",
]
