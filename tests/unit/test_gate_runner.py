"""fixpack.gates: the one gate client and runner, against a loopback server, for a port that
declares its gates in port.yaml (the ports' own gates are tested in ports/*/tests)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from fixpack.gates.__main__ import main
from fixpack.gates.client import Client, GateError

GATES_MODULE = '''"""Gates of port p."""
from fixpack.gates.client import Result

def greet(client, opts):
    msg = client.chat([{"role": "user", "content": "hi"}])
    return Result("greet", "pass" if msg["content"] == opts.word else "fail", msg["content"])

def offline(client, opts):
    return Result("offline", "not measured", "no reference")

def broken(client, opts):
    raise ValueError("boom")

GATES = {"greet": greet, "offline": offline, "broken": broken}
DEFAULT = ["greet", "offline"]
NO_SERVER = {"offline"}

def add_arguments(p):
    p.add_argument("--word", default="hello")
'''


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _json(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self._json({"data": [{"id": "org/model"}]})
        self._json({"error": "not found"}, 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            return self._json({"error": "not found"}, 404)
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in ("hel", "lo"):
                chunk = {"choices": [{"delta": {"content": piece}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
            return
        word = "hello" if body.get("temperature") == 0 else "sampled"
        self._json({"choices": [{"message": {"role": "assistant", "content": word}, "finish_reason": "stop"}]})


@pytest.fixture()
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def pack(tmp_path):
    gates = tmp_path / "ports" / "p" / "tests" / "hpu"
    gates.mkdir(parents=True)
    name = f"p_gates_{tmp_path.name}"
    (gates / f"{name}.py").write_text(GATES_MODULE)
    port = {"name": "p", "gates": {"module": name, "path": "ports/p/tests/hpu"}}
    (tmp_path / "ports" / "p" / "port.yaml").write_text(yaml.safe_dump(port))
    return tmp_path


def test_the_client_speaks_the_openai_api(server):
    c = Client(server + "/v1/")
    assert c.model == "org/model"
    assert c.chat([]) == {"role": "assistant", "content": "hello"}  # greedy unless told
    assert c.chat_reply([])["choices"][0]["message"]["content"] == "sampled"  # the server's sampling
    reply = c.chat_stream_reply([])
    assert reply["choices"][0]["message"]["content"] == "hello" and reply["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(GateError, match="POST /tokenize: HTTP 404"):
        c.tokens("a b")
    assert c.count_tokens("a b") is None


def test_a_port_yaml_gates_section_runs_under_the_one_runner(server, pack, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["--port", "p", "--pack", str(pack), "--base-url", server, "--json", str(out)])
    assert rc == 0  # not measured fails only under --strict
    data = json.loads(out.read_text())
    assert data["model"] == "org/model" and data["server"] == server
    assert [(g["gate"], g["result"], g["figures"]) for g in data["gates"]] == [
        ("greet", "pass", "hello"),
        ("offline", "not measured", "no reference"),
    ]
    assert capsys.readouterr().out.splitlines()[0].split() == ["gate", "result", "figures"]
    assert main(["--port", "p", "--pack", str(pack), "--base-url", server, "--strict"]) == 1
    assert main(["--port", "p", "--pack", str(pack), "--base-url", server, "--only", "greet", "--word", "bye"]) == 1


def test_a_gate_that_raises_is_an_error_and_a_bad_selection_is_usage(server, pack, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--port", "p", "--pack", str(pack), "--base-url", server, "--only", "broken", "--json", str(out)]) == 1
    (g,) = json.loads(out.read_text())["gates"]
    assert g["result"] == "error" and g["figures"] == "ValueError: boom"
    assert main(["--port", "p", "--pack", str(pack), "--only", "offline", "--base-url", "http://127.0.0.1:9"]) == 0
    assert main(["--port", "p", "--pack", str(pack), "--only", "nope"]) == 2
    assert "unknown gate(s) nope; known: greet, offline, broken" in capsys.readouterr().err


def test_a_port_without_a_gates_module_is_refused(tmp_path):
    (tmp_path / "ports" / "q").mkdir(parents=True)
    (tmp_path / "ports" / "q" / "port.yaml").write_text("name: q\ngates: {runner: x.sh}\n")
    with pytest.raises(SystemExit, match="no 'gates' section with 'module' and 'path'"):
        main(["--port", "q", "--pack", str(tmp_path)])


def test_the_repository_ports_declare_gates_the_runner_loads():
    from fixpack.gates.__main__ import port_gates

    repo = Path(__file__).resolve().parents[2]
    for port in ("glm-5-3-flash", "glm-5-mxfp4"):
        module = port_gates(repo, port)
        assert module.GATES and callable(module.add_arguments), port
