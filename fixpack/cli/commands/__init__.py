"""One module per command; each exposes ``add_parser(subparsers)`` and ``run(args) -> int``."""
