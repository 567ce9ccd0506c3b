"""``habana_frameworks.torch.utils.experimental``: the device type (vllm-gaudi picks kernels and
features by it) and the data pointer helper."""

import enum

from hpu_emulation import config


class synDeviceType(enum.IntEnum):  # noqa: N801 - the bridge's name
    synDeviceGaudi = 0
    synDeviceGaudi2 = 1
    synDeviceGaudi3 = 2


def _get_device_type() -> synDeviceType:
    return synDeviceType.synDeviceGaudi2 if config.card().name == "gaudi2" else synDeviceType.synDeviceGaudi3


def _data_ptr(tensor) -> int:
    return tensor.data_ptr()
