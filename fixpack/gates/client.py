"""The HTTP client of the device gates (OpenAI API, standard library only), their result record,
and the runner of a gate's own script."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A result is one of these. pass/recorded count as passed; fail/error always fail the run; the
# rest (no reference yet, an input not given, a script not there) fail it only under --strict.
PASSED = ("pass", "recorded")
FAILED = ("fail", "error")
PENDING = ("not measured", "not run", "missing")


@dataclass
class Result:
    gate: str
    result: str  # one of PASSED, FAILED, PENDING
    figures: Any = ""  # a one-line summary, or a mapping of the gate's figures
    details: Any = field(default_factory=dict)
    seconds: float = 0.0


def table(results: list[Result]) -> str:
    rows = [("gate", "result", "figures")] + [(r.gate, r.result, figures_text(r.figures)) for r in results]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    out = [f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in rows]
    out.insert(1, f"{'-' * w0}  {'-' * w1}  {'-' * 7}")
    return "\n".join(out)


def figures_text(figures: Any) -> str:
    return figures if isinstance(figures, str) else json.dumps(figures)


class GateError(RuntimeError):
    """The gate could not run (a request failed or a reply was malformed)."""


class Client:
    """An OpenAI-compatible server (vLLM's): its /v1 API, /tokenize and /metrics."""

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

    def post_status(self, path: str, body: dict) -> tuple[int, Any]:
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

    def get_text(self, path: str) -> str:
        try:
            with self._request("GET", path) as resp:
                return resp.read().decode()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise GateError(f"GET {path}: {exc}") from exc

    def get(self, path: str) -> dict:
        text = self.get_text(path)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise GateError(f"GET {path}: not JSON: {text[:200]!r}") from exc

    def post(self, path: str, body: dict) -> dict:
        try:
            status, data = self.post_status(path, body)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise GateError(f"POST {path}: {exc}") from exc
        if status != 200:
            raise GateError(f"POST {path}: HTTP {status}: {str(data)[:300]}")
        return data

    def stream(self, path: str, body: dict):
        """Yield (arrival time, event) for each server-sent event; stops at [DONE]. The time is
        time.perf_counter()'s."""
        body = dict(body, stream=True)
        try:
            resp = self._request("POST", path, body)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:300]
            raise GateError(f"POST {path} (stream): HTTP {exc.code}: {text}") from exc
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
            status, data = self.post_status(
                "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
            )
        except (urllib.error.URLError, OSError, ValueError):
            return None
        if status != 200 or not isinstance(data, dict) or "count" not in data:
            return None
        return int(data["count"])

    def tokens(self, text: str) -> int:
        """Token count from /tokenize (special tokens included); GateError when the server has none."""
        out = self.post("/tokenize", {"model": self.model, "prompt": text})
        return int(out.get("count", len(out.get("tokens", []))))

    # ---- chat: *_reply give the whole reply (choices, usage); chat and chat_stream the message
    def chat_reply(self, messages: list, **kw) -> dict:
        """The reply as the server sends it; sampling is the server's default unless ``kw`` sets it."""
        return self.post("/v1/chat/completions", dict({"model": self.model, "messages": messages}, **kw))

    def chat_stream_reply(self, messages: list, **kw) -> dict:
        """A streamed chat answer folded into a non-streamed reply: choices[0] holds the message
        (content, reasoning_content, tool_calls) and finish_reason."""
        body = dict({"model": self.model, "messages": messages}, **kw)
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish = None
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
                finish = ch.get("finish_reason") or finish
        msg: dict = {"role": "assistant", "content": "".join(content), "reasoning_content": "".join(reasoning)}
        if calls:
            msg["tool_calls"] = [{"type": "function", "function": calls[i]} for i in sorted(calls)]
        return {"choices": [{"message": msg, "finish_reason": finish}]}

    def chat(self, messages: list, **kw) -> dict:
        """choices[0].message of a greedy answer (temperature 0 unless ``kw`` sets it)."""
        return _message(self.chat_reply(messages, **dict({"temperature": 0}, **kw)))

    def chat_stream(self, messages: list, **kw) -> dict:
        """choices[0].message of a streamed greedy answer, put back together."""
        return _message(self.chat_stream_reply(messages, **dict({"temperature": 0}, **kw)))


def _message(reply: dict) -> dict:
    try:
        return reply["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise GateError(f"chat reply without choices[0].message: {str(reply)[:300]}") from exc


def run_script(
    cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None
) -> tuple[str, str, dict]:
    """(result, figures, details) of a gate's own script: its exit code 0 passes."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return "fail", f"timed out after {timeout:g} s", {"cmd": cmd}
    except OSError as exc:
        return "error", f"cannot run: {exc}", {"cmd": cmd}
    tail = [line for line in (proc.stdout + "\n" + proc.stderr).strip().splitlines() if line.strip()]
    last = tail[-1][:160] if tail else ""
    details = {
        "cmd": cmd,
        "rc": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "output_tail": tail[-20:],
    }
    result = "pass" if proc.returncode == 0 else "fail"
    return result, (f"rc {proc.returncode}" + (f": {last}" if last else "")), details
