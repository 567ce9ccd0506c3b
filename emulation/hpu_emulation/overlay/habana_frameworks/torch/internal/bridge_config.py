"""``habana_frameworks.torch.internal.bridge_config``: the bridge's settings as vllm-gaudi reads them."""

import contextlib
import os


def get_pt_compile_only_mode() -> bool:
    return os.environ.get("PT_COMPILE_ONLY_MODE", "0") not in ("", "0", "false", "False")


@contextlib.contextmanager
def env_setting(name: str, value):
    """Set a bridge setting for the duration of a block (vllm-gaudi sets compile-only mode so)."""
    old = os.environ.get(name)
    os.environ[name] = str(value)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
