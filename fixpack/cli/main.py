"""The fixpack command line: parses and dispatches; each command lives in fixpack/cli/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys

from fixpack import __version__
from fixpack.errors import FixpackError

COMMANDS = ["list", "show", "apply", "verify", "revert", "validate", "sources", "manifest", "lock", "check", "rebase_report", "refresh", "recipe", "edit", "commit"]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that command's (the others are not even imported: a
    container start runs `verify` or `apply` and should not pay for the rest)."""
    parser = argparse.ArgumentParser(prog="fixpack", description="Hash-pinned source fixes for vLLM on Intel Gaudi.")
    parser.add_argument("--version", action="version", version=f"fixpack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in [only] if only else COMMANDS:
        try:
            module = importlib.import_module(f"fixpack.cli.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fixpack.cli.commands.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def _command(argv: list[str]) -> str | None:
    first = next((a for a in argv if not a.startswith("-")), None)
    name = first.replace("-", "_") if first else None
    return name if name in COMMANDS and first == argv[0] else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except FixpackError as exc:
        print(f"fixpack: {exc.label}: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into `head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("fixpack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
