"""The device-gate client (the tests/hpu/gates package) against a small OpenAI-compatible server.

The server here is a stand-in: stdlib http.server on 127.0.0.1 (random port), answering
/v1/models, /tokenize (one token a word), /v1/completions and /v1/chat/completions, streamed
(SSE) and not, with tool calls and a 400 for more than four images. A `Behaviour` decides each
answer, so every gate is shown to pass on a correct server and to fail on a wrong one. The
server stops itself after a bounded number of requests or seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

HPU = Path(__file__).resolve().parent / "hpu"


def _load_gates():
    # Under its own name: the pack root has a gates/ folder too (the pack's device gates).
    spec = importlib.util.spec_from_file_location(
        "glm_gates", HPU / "gates" / "__init__.py", submodule_search_locations=[str(HPU / "gates")]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["glm_gates"] = mod
    spec.loader.exec_module(mod)
    return mod


gates = _load_gates()


# --------------------------------------------------------------------------- the stand-in server
def golden_ids(prompt: str, max_tokens: int) -> list[int]:
    return list(hashlib.sha256(prompt.encode()).digest()[: min(max_tokens, 8)])


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content or [] if p.get("type") == "text")


def images_of(content) -> list[str]:
    if isinstance(content, str):
        return []
    return [p["image_url"]["url"] for p in content or [] if p.get("type") == "image_url"]


IMAGE_ORACLE = {}
for _name, _parts, _expect in gates.image_cases():
    key = tuple(images_of(_parts))
    IMAGE_ORACLE[key] = (
        str(_expect)
        if isinstance(_expect, int)
        else (", ".join(_expect) if isinstance(_expect, list) else _expect.capitalize() + ".")
    )


class Behaviour:
    """A correct server. Subclasses get one thing wrong."""

    token_delay = 0.0  # seconds between streamed tokens
    prefill_delay = 0.0  # seconds before the first token
    max_images = 4

    def token_ids(self, prompt, max_tokens):
        return golden_ids(prompt, max_tokens)

    def prefill_seconds(self, prompt_words: int) -> float:
        return self.prefill_delay

    def needle(self, codes: dict, asked: str) -> str:
        return codes[asked]

    def parallel(self, cities: list[str]) -> list[str]:
        return cities

    def image_answer(self, urls) -> str:
        return IMAGE_ORACLE.get(tuple(urls), "I cannot tell.")

    def chat(self, body) -> dict:
        msgs = body["messages"]
        last = msgs[-1]
        if last["role"] == "tool":
            data = json.loads(last["content"])
            return {"content": f"It is {data['temperature_c']} degrees in {data['city']}, {data['sky']}."}
        text = text_of(last["content"])
        urls = images_of(last["content"])
        if urls:
            return {"content": self.image_answer(urls)}
        codes = dict(re.findall(r"access code for the (\w+) door is (\d+)\.", text))
        asked = re.search(r"What is the access code for the (\w+) door\?", text)
        if asked:
            return {"content": self.needle(codes, asked.group(1))}
        order = re.search(r"order number is (ZX-\d+)", text)
        if order and body.get("tools"):
            return {"tool_calls": [("lookup_order", {"order_number": order.group(1)})]}
        if "17 plus 25" in text:
            return {"content": "42"}
        cities = [c for c in ("Paris", "Tokyo") if c in text.split("?")[0]]
        if cities and body.get("tools"):
            return {"tool_calls": [("get_weather", {"city": c}) for c in self.parallel(cities)]}
        return {"content": "I do not know."}


class Server:
    def __init__(self, behaviour: Behaviour, max_requests: int = 400, lifetime_s: float = 30.0):
        self.behaviour = behaviour
        self.requests = 0
        self.max_requests = max_requests
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _count(self) -> bool:
                server.requests += 1
                server.paths.append(self.path)
                if server.requests > server.max_requests:
                    self._json(503, {"error": "request budget spent"})
                    threading.Thread(target=server.stop, daemon=True).start()
                    return False
                return True

            def do_GET(self):
                if not self._count():
                    return
                if self.path == "/v1/models":
                    return self._json(
                        200, {"object": "list", "data": [{"id": "zai-org/GLM-5.3-Flash", "object": "model"}]}
                    )
                self._json(404, {"error": "not found"})

            def do_POST(self):
                if not self._count():
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                b = server.behaviour
                if self.path == "/tokenize":
                    return self._json(200, {"count": len(body["prompt"].split()), "max_model_len": 262144})
                if self.path == "/v1/completions":
                    return self.completion(body)
                if self.path == "/v1/chat/completions":
                    if sum(len(images_of(m.get("content"))) for m in body["messages"]) > b.max_images:
                        return self._json(
                            400,
                            {
                                "object": "error",
                                "message": f"At most {b.max_images} image(s) may be provided in one prompt.",
                                "code": 400,
                            },
                        )
                    return self.chat(body)
                self._json(404, {"error": "not found"})

            def _sse(self, events):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for ev in events:
                    self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def completion(self, body):
                b = server.behaviour
                n = int(body.get("max_tokens", 16))
                if not body.get("stream"):
                    return self._json(
                        200,
                        {
                            "choices": [
                                {
                                    "index": 0,
                                    "text": "x" * n,
                                    "token_ids": b.token_ids(body["prompt"], n),
                                    "finish_reason": "length",
                                }
                            ]
                        },
                    )

                def events():
                    time.sleep(b.prefill_seconds(len(body["prompt"].split())))
                    for i in range(n):
                        if i:
                            time.sleep(b.token_delay)
                        yield {"choices": [{"index": 0, "text": f"t{i} "}]}
                    yield {
                        "choices": [],
                        "usage": {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": n},
                    }

                self._sse(events())

            def chat(self, body):
                ans = server.behaviour.chat(body)
                calls = [
                    {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    for i, (name, args) in enumerate(ans.get("tool_calls", []))
                ]
                if not body.get("stream"):
                    msg = {"role": "assistant", "content": ans.get("content"), "reasoning_content": "thinking"}
                    if calls:
                        msg["tool_calls"] = calls
                    return self._json(
                        200,
                        {"choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}]},
                    )

                def events():
                    yield {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "thinking"}}]}
                    content = ans.get("content") or ""
                    for k in range(0, len(content), 3):
                        yield {"choices": [{"index": 0, "delta": {"content": content[k : k + 3]}}]}
                    for i, c in enumerate(calls):  # name first, the arguments in two pieces
                        args = c["function"]["arguments"]
                        yield {
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {
                                        "tool_calls": [
                                            {
                                                "index": i,
                                                "id": c["id"],
                                                "type": "function",
                                                "function": {"name": c["function"]["name"]},
                                            }
                                        ]
                                    },
                                }
                            ]
                        }
                        yield {
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {
                                        "tool_calls": [{"index": i, "function": {"arguments": args[: len(args) // 2]}}]
                                    },
                                }
                            ]
                        }
                        yield {
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {
                                        "tool_calls": [{"index": i, "function": {"arguments": args[len(args) // 2 :]}}]
                                    },
                                }
                            ]
                        }
                    yield {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]}

                self._sse(events())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.timer = threading.Timer(lifetime_s, self.stop)
        self.timer.daemon = True

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        self.thread.start()
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        self.stop()


@pytest.fixture()
def serve():
    started = []

    def start(behaviour=None, **kw):
        s = Server(behaviour or Behaviour(), **kw).__enter__()
        started.append(s)
        return s

    yield start
    for s in started:
        s.__exit__(None, None, None)


# --------------------------------------------------------------------------- options and files
def options(url, tmp_path, **over):
    golden = tmp_path / "golden"
    golden.mkdir(exist_ok=True)
    prompts = [
        {"id": "a", "prompt": "one two three", "max_tokens": 8},
        {"id": "b", "prompt": "four five", "max_tokens": 4},
    ]
    (golden / "prompts.json").write_text(json.dumps(prompts))
    sink = tmp_path / "kernels" / "sinkhorn"
    sink.mkdir(parents=True, exist_ok=True)
    pack = tmp_path / "pack"  # a pack root: fixes/<id>/, ports/<p>/fixes/<id>/, gates/<name>/
    pack.mkdir(exist_ok=True)
    base = dict(
        base_url=url,
        model=None,
        api_key=None,
        only=None,
        json=None,
        strict=False,
        timeout=10.0,
        golden_dir=golden,
        record_golden=None,
        needle_lengths=[300, 700],
        tool_doc_tokens=400,
        answer_tokens=64,
        chat_kwargs={"reasoning_effort": "low"},
        decode_lengths=[100, 300],
        decode_floors=[15.0, 10.0],
        decode_tokens=8,
        ttft_lengths=[100, 200, 300],
        ttft_limit=5.0,
        sinkhorn_dir=sink,
        sinkhorn_cmd=None,
        pack_root=pack,
        script_timeout=20.0,
        record_fp8=None,
    )
    base.update(over)
    return SimpleNamespace(**base)


def device_gate(opts, folder: str, code: str):
    path = opts.pack_root / folder / "device_gate.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)


def write_reference(opts, prompts_ids: dict, name: str = "reference_ids.json", model: str | None = None):
    measured = {"note": "test"} | ({"model": model} if model else {})
    (opts.golden_dir / name).write_text(json.dumps({"format": 1, "measured": measured, "ids": prompts_ids}))


def by_gate(results):
    return {r.gate: r for r in results}


# --------------------------------------------------------------------------- every gate, correct server
def test_every_gate_passes_against_a_correct_server(serve, tmp_path):
    s = serve()
    opts = options(s.url, tmp_path)
    write_reference(opts, {"a": golden_ids("one two three", 8), "b": golden_ids("four five", 4)})
    write_reference(
        opts,
        {"a": golden_ids("one two three", 8), "b": golden_ids("four five", 4)},
        gates.REFERENCE_FP8_IDS,
        model="zai-org/GLM-5.3-Flash",
    )
    (opts.sinkhorn_dir / "gate.py").write_text("print('bit-identical 1..1024 rows')\n")
    device_gate(
        opts,
        "fixes/needs-server",
        "import os, sys, urllib.request\n"
        "urllib.request.urlopen(os.environ['GATE_BASE_URL'] + '/v1/models').read()\n"
        "print('model', os.environ['GATE_MODEL'])\n",
    )
    results = gates.run_gates(opts)
    r = by_gate(results)
    assert [x.gate for x in results] == [
        "golden",
        "fp8",
        "needles",
        "tools",
        "images",
        "decode",
        "prefill",
        "sinkhorn",
        "fix:needs-server",
    ]
    assert {x.gate: x.result for x in results} == {x.gate: "pass" for x in results}
    assert r["golden"].figures == "2/2 identical" and r["fp8"].figures == "2/2 identical"
    assert r["needles"].figures.startswith("6/6 at ")
    assert r["tools"].figures == "8/8"
    assert set(r["tools"].details) >= {"single, streamed", "parallel, not streamed", "no call, streamed", "multi-turn"}
    assert r["images"].figures == "8/8"
    assert r["images"].details["5 images rejected"]["pass"]
    assert "tok/s (floor 15)" in r["decode"].figures and "(floor 10)" in r["decode"].figures
    assert r["sinkhorn"].figures == "rc 0: bit-identical 1..1024 rows"
    assert r["fix:needs-server"].figures == "rc 0: model zai-org/GLM-5.3-Flash"


def test_needle_documents_have_the_asked_size_and_depths(serve, tmp_path):
    s = serve()
    client = gates.Client(s.url)
    inserts = [(f, gates.needle_sentence(c, "123")) for c, f in gates.DOORS]
    text, tokens, counted = gates.sized_document(client, 2000, seed=1, inserts=inserts)
    assert counted and abs(tokens - 2000) <= 20
    words = text.split()
    for colour, frac in gates.DOORS:
        at = words.index(colour) / len(words)
        assert abs(at - frac) < 0.02, (colour, at)


# --------------------------------------------------------------------------- failures are detected
def test_golden_without_reference_is_not_measured_and_can_be_recorded(serve, tmp_path):
    s = serve()
    rec = tmp_path / "measured.json"
    opts = options(s.url, tmp_path, only="golden", record_golden=rec)
    (r,) = gates.run_gates(opts)
    assert r.result == "not measured"
    data = json.loads(rec.read_text())
    assert data["format"] == 1 and data["ids"]["a"] == golden_ids("one two three", 8)


def test_golden_names_the_first_differing_token(serve, tmp_path):
    s = serve()
    opts = options(s.url, tmp_path, only="golden")
    ref = golden_ids("one two three", 8)
    write_reference(opts, {"a": ref[:3] + [999] + ref[4:], "b": golden_ids("four five", 4)})
    (r,) = gates.run_gates(opts)
    assert (r.result, r.figures) == ("fail", "1/2 identical")
    assert r.details["differences"]["a"].startswith(f"first difference at token 3 (got {ref[3]}, reference 999)")


def test_fp8_gate_is_not_measured_without_its_reference_or_on_another_model(serve, tmp_path):
    s = serve()
    rec = tmp_path / "fp8.json"
    opts = options(s.url, tmp_path, only="fp8", record_fp8=rec)
    write_reference(opts, {"a": [1], "b": [2]})  # the BF16 golden ids are not the FP8 gate's reference
    (r,) = gates.run_gates(opts)
    assert (r.gate, r.result) == ("fp8", "not measured") and "reference_fp8_ids.json" in r.figures
    assert json.loads(rec.read_text())["ids"]["a"] == golden_ids("one two three", 8)
    ids = {"a": golden_ids("one two three", 8), "b": golden_ids("four five", 4)}
    write_reference(opts, ids, gates.REFERENCE_FP8_IDS, model="zai-org/GLM-5.3-BF16")
    (r,) = gates.run_gates(opts)
    assert r.result == "not measured" and "measured on 'zai-org/GLM-5.3-BF16'" in r.figures


def test_fp8_gate_names_the_first_differing_token(serve, tmp_path):
    s = serve()
    opts = options(s.url, tmp_path, only="fp8")
    ref = golden_ids("four five", 4)
    write_reference(
        opts,
        {"a": golden_ids("one two three", 8), "b": ref[:1] + [7] + ref[2:]},
        gates.REFERENCE_FP8_IDS,
        model="zai-org/GLM-5.3-Flash",
    )
    (r,) = gates.run_gates(opts)
    assert (r.gate, r.result, r.figures) == ("fp8", "fail", "1/2 identical")
    assert r.details["differences"]["b"].startswith(f"first difference at token 1 (got {ref[1]}, reference 7)")


def test_a_server_without_token_ids_is_an_error_not_a_pass(serve, tmp_path):
    class NoIds(Behaviour):
        def token_ids(self, prompt, max_tokens):
            return None

    s = serve(NoIds())
    opts = options(s.url, tmp_path, only="golden")
    write_reference(opts, {"a": [1], "b": [2]})
    (r,) = gates.run_gates(opts)
    assert r.result == "error" and "token_ids" in r.figures


def test_wrong_needle_fails_the_needle_gate(serve, tmp_path):
    class WrongDoor(Behaviour):
        def needle(self, codes, asked):
            return codes["green"]  # always the middle needle

    s = serve(WrongDoor())
    (r,) = gates.run_gates(options(s.url, tmp_path, only="needles"))
    assert r.result == "fail"
    assert r.figures.startswith("2/6 at ")
    assert [k for k, v in r.details.items() if v["pass"]] == ["300:green@50%", "700:green@50%"]


def test_one_call_for_a_parallel_request_fails_the_tool_gate(serve, tmp_path):
    class OneCall(Behaviour):
        def parallel(self, cities):
            return cities[:1]

    s = serve(OneCall())
    (r,) = gates.run_gates(options(s.url, tmp_path, only="tools"))
    assert (r.result, r.figures) == ("fail", "6/8")
    assert not r.details["parallel, streamed"]["pass"] and not r.details["parallel, not streamed"]["pass"]


def test_images_gate_fails_on_a_wrong_colour_and_on_accepting_five_images(serve, tmp_path):
    class ColourBlind(Behaviour):
        max_images = 8

        def image_answer(self, urls):
            ans = super().image_answer(urls)
            return "Green." if ans == "Red." else ans

    s = serve(ColourBlind())
    (r,) = gates.run_gates(options(s.url, tmp_path, only="images"))
    assert (r.result, r.figures) == ("fail", "6/8")
    failed = sorted(k for k, v in r.details.items() if not v["pass"])
    assert failed == ["5 images rejected", "solid red"]


def test_image_judging_rules():
    assert gates.judge_image("Red.", "red")
    assert not gates.judge_image("Red or green.", "red")
    assert gates.judge_image("The image is colored green.", "green")
    assert gates.judge_image("red, green, blue, yellow", ["red", "green", "blue", "yellow"])
    assert not gates.judge_image("green, red, blue, yellow", ["red", "green", "blue", "yellow"])
    assert gates.judge_image("There are three.", 3) and gates.judge_image("3", 3)
    assert not gates.judge_image("3 or 4", 3)


def test_a_slow_server_fails_the_decode_floor(serve, tmp_path):
    class Slow(Behaviour):
        token_delay = 0.1  # 10 tokens/s, under the 15 tokens/s floor at 2K

    s = serve(Slow())
    (r,) = gates.run_gates(
        options(s.url, tmp_path, only="decode", decode_lengths=[100], decode_floors=[15.0], decode_tokens=6)
    )
    assert r.result == "fail"
    (fig,) = r.details.values()
    assert 7.0 < fig["tokens_per_s"] < 10.5 and fig["floor"] == 15.0 and not fig["pass"]


def test_a_slow_long_prefill_fails_the_ttft_limit(serve, tmp_path):
    class SlowLong(Behaviour):
        def prefill_seconds(self, words):
            return 0.4 if words > 250 else 0.0

    s = serve(SlowLong())
    (r,) = gates.run_gates(options(s.url, tmp_path, only="prefill", ttft_limit=0.3))
    assert r.result == "fail"
    longest = list(r.details.values())[-1]
    assert longest["ttft_s"] >= 0.4 and longest["limit_s"] == 0.3
    (r,) = gates.run_gates(options(s.url, tmp_path, only="prefill", ttft_limit=5.0))
    assert r.result == "pass"


def test_sinkhorn_hook_reports_missing_and_failing_scripts(tmp_path):
    opts = options("http://127.0.0.1:9", tmp_path, only="sinkhorn")
    (r,) = gates.run_gates(opts)
    assert r.result == "missing"
    (opts.sinkhorn_dir / "run_gate.sh").write_text("echo 'row 17: 2 ulp apart'; exit 1\n")
    (r,) = gates.run_gates(opts)
    assert (r.result, r.figures) == ("fail", "rc 1: row 17: 2 ulp apart")


def test_fix_scripts_are_each_reported(serve, tmp_path):
    s = serve()
    opts = options(s.url, tmp_path, only="fixes")
    (r,) = gates.run_gates(opts)
    assert (r.gate, r.result) == ("fixes", "missing")
    device_gate(opts, "fixes/a-ok", "print('fine')\n")
    device_gate(opts, "ports/p/fixes/b-bad", "import sys; print('wrong rows'); sys.exit(3)\n")
    device_gate(opts, "gates/c-undecided", "import sys; print('ids differ at row 3'); sys.exit(1)\n")
    (opts.pack_root / "fixes" / "a-ok" / "helper.py").write_text("raise SystemExit(1)\n")  # not a gate
    results = gates.run_gates(opts)
    assert [(x.gate, x.result, x.figures) for x in results] == [
        ("fix:a-ok", "pass", "rc 0: fine"),
        ("fix:b-bad", "fail", "rc 3: wrong rows"),
        ("fix:c-undecided", "fail", "rc 1: ids differ at row 3"),
    ]


def test_a_server_that_is_down_gives_errors_and_exit_1(tmp_path, capsys):
    port = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{port.server_address[1]}"
    port.server_close()  # nothing listens there now
    out = tmp_path / "r.json"
    rc = gates.main(["--base-url", url, "--only", "tools,images", "--timeout", "2", "--json", str(out)])
    assert rc == 1
    data = json.loads(out.read_text())
    assert [(g["gate"], g["result"]) for g in data["gates"]] == [("tools", "error"), ("images", "error")]
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["gate", "result", "figures"] and table[2].split()[:2] == ["tools", "error"]


def test_exit_code_counts_not_measured_only_when_strict(serve, tmp_path):
    s = serve()
    opts = options(s.url, tmp_path)
    args = ["--base-url", s.url, "--only", "golden", "--golden-dir", str(opts.golden_dir)]
    assert gates.main(args) == 0
    assert gates.main(args + ["--strict"]) == 1


def test_png_images_hold_the_pixels_asked_for():
    def decode(url):
        raw = __import__("base64").b64decode(url.split(",", 1)[1])
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        w, h = struct.unpack(">II", raw[16:24])
        idat = raw[raw.index(b"IDAT") + 4 : raw.index(b"IEND") - 8]
        rows = zlib.decompress(idat)
        stride = 1 + 3 * w
        return lambda x, y: tuple(rows[y * stride + 1 + 3 * x : y * stride + 4 + 3 * x])

    px = decode(gates.quadrants(336))
    assert [px(10, 10), px(300, 10), px(10, 300), px(300, 300)] == [gates.COLOURS[c] for c in gates.QUADRANTS]
    px = decode(gates.squares(3))
    row = [px(x, 168) for x in range(336)]
    # neighbours (strict=False: row[1:] is one shorter)
    runs = sum(
        1 for a, b in zip(row, row[1:], strict=False) if a == gates.COLOURS["white"] and b == gates.COLOURS["black"]
    )
    assert runs == 3


def test_the_server_stops_itself_after_its_request_budget(serve):
    s = serve(max_requests=2)
    client = gates.Client(s.url, timeout=2)
    client.get("/v1/models")
    client.get("/v1/models")
    with pytest.raises(gates.GateError, match="503"):
        client.post("/v1/completions", {"prompt": "x"})
    time.sleep(0.3)
    with pytest.raises(gates.GateError):
        client.get("/v1/models")


def test_fix_scripts_run_without_a_server(tmp_path):
    opts = options("http://127.0.0.1:9", tmp_path, only="fixes", timeout=1.0)
    device_gate(opts, "fixes/offline", "import os; print('model=' + os.environ['GATE_MODEL'])\n")
    (r,) = gates.run_gates(opts)
    assert (r.gate, r.result, r.figures) == ("fix:offline", "pass", "rc 0: model=")
