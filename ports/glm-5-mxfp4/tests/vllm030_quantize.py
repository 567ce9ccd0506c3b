"""vLLM 0.30.0's Triton MXFP4 quantizer, run by Triton's CPU interpreter, in a process of its own.

    python vllm030_quantize.py VLLM_TREE < bf16 bit patterns (JSON, rows of 32k) -> one JSON object

VLLM_TREE is first on PYTHONPATH (see vllm030_check.py). What runs is `downcast_to_mxfp` from
vllm/model_executor/layers/quantization/utils/mxfp4_utils.py, the kernel `mxfp4_quantize` uses
on CUDA. TRITON_INTERPRET=1 executes it with numpy on the CPU (IEEE float32, subnormals kept):
the same code, not the same hardware, so what it prints for subnormal elements says nothing of a GPU.
"""

from __future__ import annotations

import json
import os
import sys
import types


def main(tree: str) -> dict:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported
    import numpy as np
    import torch
    import triton
    import triton.language as tl

    # vllm.triton_utils disables Triton when no "vllm" distribution is installed (here it is a
    # bare tree): hand mxfp4_utils the real triton instead of its placeholder
    shim = types.ModuleType("vllm.triton_utils")
    shim.triton, shim.tl, shim.HAS_TRITON = triton, tl, True
    sys.modules["vllm.triton_utils"] = shim
    from vllm.model_executor.layers.quantization.utils import mxfp4_utils

    bits = np.array(json.load(sys.stdin), dtype=np.uint16)
    x = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    q, s, _ = mxfp4_utils.downcast_to_mxfp(x, axis=-1)
    return {
        "file": mxfp4_utils.__file__,
        "triton": triton.__version__,
        "q": q.numpy().tolist(),
        "s": s.numpy().tolist(),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
