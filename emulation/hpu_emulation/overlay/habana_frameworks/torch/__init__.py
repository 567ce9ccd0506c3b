"""``habana_frameworks.torch``: importing it registers the ``hpu`` device, as the real bridge does.

Module layout follows Intel Gaudi's PyTorch documentation (``habana_frameworks.torch.core``,
``.hpu``, ``.utils``, ``.hpex``); each piece says which vllm-gaudi call it serves.
"""

import torch  # noqa: F401 - vllm-gaudi does `from habana_frameworks.torch import torch`

from habana_frameworks.torch import core, hpu, utils  # noqa: F401
from hpu_emulation import activate_device

activate_device()

from habana_frameworks.torch import dynamo, internal  # noqa: E402,F401
