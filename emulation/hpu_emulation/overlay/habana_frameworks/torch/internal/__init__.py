from habana_frameworks.torch.internal import bridge_config  # noqa: F401
