"""fixpack: hash-pinned source fixes and model ports for vLLM on Intel Gaudi."""

__version__ = "0.2.0"
