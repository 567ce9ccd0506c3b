from habana_frameworks.torch.utils import experimental, internal  # noqa: F401
