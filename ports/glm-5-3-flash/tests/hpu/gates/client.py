"""The HTTP client of the device gates (OpenAI API, standard library only), their results, and
the runner of a gate's own script."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path



# --------------------------------------------------------------------------- results
@dataclass
class Result:
    gate: str
    result: str  # pass, fail, error, not measured, missing
    figures: str = ""
    details: dict = field(default_factory=dict)
    seconds: float = 0.0


def table(results: list[Result]) -> str:
    rows = [("gate", "result", "figures")] + [(r.gate, r.result, r.figures) for r in results]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    out = [f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
    out.insert(1, f"{'-' * w0}  {'-' * w1}  {'-' * 7}")
    return "\n".join(out)


class GateError(Exception):
    """The gate could not run (a request failed or a reply was malformed)."""


# --------------------------------------------------------------------------- HTTP client
class Client:
    def __init__(self, base_url: str, model: str | None = None, timeout: float = 1800.0, api_key: str | None = None):
        self.base = base_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.timeout = timeout
        self.api_key = api_key
        self._model = model

    def _request(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        return urllib.request.urlopen(req, timeout=self.timeout)

    def post_status(self, path: str, body: dict) -> tuple[int, dict | str]:
        """(HTTP status, parsed body) without raising on 4xx/5xx."""
        try:
            with self._request("POST", path, body) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, text

    def get(self, path: str) -> dict:
        try:
            with self._request("GET", path) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise GateError(f"GET {path}: {exc}") from exc

    def post(self, path: str, body: dict) -> dict:
        try:
            status, data = self.post_status(path, body)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise GateError(f"POST {path}: {exc}") from exc
        if status != 200:
            raise GateError(f"POST {path}: HTTP {status}: {str(data)[:300]}")
        return data

    def stream(self, path: str, body: dict):
        """Yield (arrival time, event) for each server-sent event; stops at [DONE]."""
        body = dict(body, stream=True)
        try:
            resp = self._request("POST", path, body)
        except urllib.error.HTTPError as exc:
            raise GateError(f"POST {path} (stream): HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise GateError(f"POST {path} (stream): {exc}") from exc
        with resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                try:
                    yield time.perf_counter(), json.loads(payload)
                except ValueError as exc:
                    raise GateError(f"POST {path} (stream): malformed event {payload[:200]!r}") from exc

    @property
    def model(self) -> str:
        if self._model is None:
            data = self.get("/v1/models").get("data") or []
            if not data:
                raise GateError("/v1/models lists no model")
            self._model = data[0]["id"]
        return self._model

    def count_tokens(self, text: str) -> int | None:
        """Token count from the server's /tokenize (vLLM), or None when it has none."""
        try:
            status, data = self.post_status("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        except (urllib.error.URLError, OSError, ValueError):
            return None
        if status != 200 or not isinstance(data, dict) or "count" not in data:
            return None
        return int(data["count"])

    def chat(self, messages: list, **kw) -> dict:
        body = {"model": self.model, "messages": messages, "temperature": 0}
        body.update(kw)
        data = self.post("/v1/chat/completions", body)
        try:
            return data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise GateError(f"chat reply without choices[0].message: {str(data)[:300]}") from exc

    def chat_stream(self, messages: list, **kw) -> dict:
        """A streamed chat answer put back together: content, reasoning and tool calls."""
        body = {"model": self.model, "messages": messages, "temperature": 0}
        body.update(kw)
        content, reasoning, calls = [], [], {}
        for _, ev in self.stream("/v1/chat/completions", body):
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                content.append(delta.get("content") or "")
                reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
                for tc in delta.get("tool_calls") or []:
                    slot = calls.setdefault(tc.get("index", 0), {"name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
        msg = {"role": "assistant", "content": "".join(content), "reasoning_content": "".join(reasoning)}
        if calls:
            msg["tool_calls"] = [{"type": "function", "function": calls[i]} for i in sorted(calls)]
        return msg



def run_script(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None) -> tuple[str, str, dict]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return "fail", f"timed out after {timeout:g} s", {"cmd": cmd}
    except OSError as exc:
        return "error", f"cannot run: {exc}", {"cmd": cmd}
    tail = [l for l in (proc.stdout + "\n" + proc.stderr).strip().splitlines() if l.strip()]
    last = tail[-1][:160] if tail else ""
    details = {"cmd": cmd, "rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1), "output_tail": tail[-20:]}
    return ("pass" if proc.returncode == 0 else "fail"), (f"rc {proc.returncode}" + (f": {last}" if last else "")), details
