#!/usr/bin/env python3
"""Device gates for a running GLM-5.3-Flash server (OpenAI API over HTTP, standard library only).

    python gates.py --base-url http://127.0.0.1:8000 [--only golden,needles,...] [--json out.json]

Gates, in the order they run:
  golden    greedy prompts (golden/prompts.json) against token ids measured on a card
            (golden/reference_ids.json). Without that file the gate is "not measured";
            --record-golden PATH writes the ids this server gives, for a person to review.
  needles   three codes at 10, 50 and 90 % depth of a filler document, one question each,
            at every --needle-lengths (tokens, counted by the server's /tokenize)
  tools     single, parallel and no call, each streamed and not; multi-turn; a call after a
            32K-token document
  images    three solid colours, quadrants, counting, text before and after the image;
            five images must be rejected with HTTP 400
  decode    single-stream decode at 2K and 128K prompts, 512 tokens with ignore_eos, timed
            from the first to the last streamed token, every shape warmed once; floors
  prefill   warm TTFT at 16K, 64K and 128K prompts; the longest must come within its limit
  sinkhorn  the Sinkhorn TPC kernel's own device test (ports/glm-5-3-flash/kernels/sinkhorn/)
  fixes     every script under tests/hpu/gates/*.py that fix authors add (see gates/README.md)

Results are "pass", "fail", "error" (the gate could not run: a request failed, a reply was
malformed), "not measured" (no reference yet) or "missing" (the script is not there). The
exit code is 1 when any gate fails or errors (with --strict also when one is not measured or
missing), else 0. Nothing here invents a number: figures are what this server answered.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import json
import os
import random
import re
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PORT_DIR = HERE.parents[1]
GOLDEN_DIR = HERE / "golden"
FIX_GATES_DIR = HERE / "gates"
SINKHORN_DIR = PORT_DIR / "kernels" / "sinkhorn"

ALL_GATES = ["golden", "needles", "tools", "images", "decode", "prefill", "sinkhorn", "fixes"]


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


# --------------------------------------------------------------------------- prompts
WORDS = {
    "adj": "quiet amber narrow distant patient wooden silver early gentle northern crowded hollow bright ancient humid".split(),
    "noun": "river lantern orchard engine library harbour meadow bridge workshop garden tower market valley archive kitchen".split(),
    "verb": "crosses follows shelters overlooks surrounds outlasts mirrors borders guards faces".split(),
    "place": "station hill square coast village canal forest quarry museum courtyard".split(),
}


def filler_sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    w = WORDS
    return [
        f"The {rng.choice(w['adj'])} {rng.choice(w['noun'])} {rng.choice(w['verb'])} the {rng.choice(w['adj'])} "
        f"{rng.choice(w['noun'])} near the {rng.choice(w['place'])} {rng.randrange(1, 1000)}."
        for _ in range(n)
    ]


def sized_document(client: Client, target_tokens: int, seed: int, inserts: list[tuple[float, str]] = ()) -> tuple[str, int, bool]:
    """Filler text of about ``target_tokens`` tokens with ``inserts`` (fraction, sentence) placed
    at those depths. Returns (text, tokens, counted): counted is False when the server has no
    /tokenize and the size is an estimate (4 characters a token)."""
    sample = " ".join(filler_sentences(200, seed))
    n = client.count_tokens(sample)
    counted = n is not None
    per_sentence = (n if counted else len(sample) / 4) / 200
    budget = target_tokens - sum(len(s) / 4 for _, s in inserts)
    count = max(1, int(budget / per_sentence))

    def build(count: int) -> str:
        sentences = filler_sentences(count, seed)
        for frac, s in sorted(inserts, key=lambda x: -x[0]):
            sentences.insert(int(round(frac * count)), s)
        return " ".join(sentences)

    text = build(count)
    tokens = client.count_tokens(text) if counted else int(len(text) / 4)
    if counted and tokens and abs(tokens - target_tokens) > 0.01 * target_tokens:
        count = max(1, int(count * target_tokens / tokens))
        text = build(count)
        tokens = client.count_tokens(text) or tokens
    return text, int(tokens), counted


def kilo(n: int) -> str:
    return f"{round(n / 1024)}K" if n >= 1024 else str(n)


# --------------------------------------------------------------------------- golden
def load_golden(golden_dir: Path) -> tuple[list[dict], dict | None]:
    """prompts.json: [{"id", "prompt", "max_tokens"}]. reference_ids.json (written only from a
    measurement on a card): {"format": 1, "measured": {...where, when, image...}, "ids": {id: [token ids]}}."""
    prompts_path = golden_dir / "prompts.json"
    if not prompts_path.is_file():
        raise GateError(f"{prompts_path} is missing")
    prompts = json.loads(prompts_path.read_text())
    ids_path = golden_dir / "reference_ids.json"
    if not ids_path.is_file() or not ids_path.read_text().strip():
        return prompts, None
    ref = json.loads(ids_path.read_text())
    if ref.get("format") != 1 or not isinstance(ref.get("ids"), dict):
        raise GateError(f"{ids_path}: expected {{'format': 1, 'measured': ..., 'ids': {{id: [ints]}}}}")
    return prompts, ref


def completion_ids(client: Client, prompt: str, max_tokens: int) -> list[int]:
    data = client.post(
        "/v1/completions",
        {"model": client.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True},
    )
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise GateError(f"completion without choices: {str(data)[:200]}") from exc
    ids = choice.get("token_ids")
    if ids is None:
        raise GateError("the server returned no choices[0].token_ids (vLLM's return_token_ids); cannot compare token ids")
    return [int(i) for i in ids]


def gate_golden(client: Client, opts) -> Result:
    prompts, ref = load_golden(opts.golden_dir)
    got = {p["id"]: completion_ids(client, p["prompt"], int(p.get("max_tokens", 64))) for p in prompts}
    if opts.record_golden:
        record = {"format": 1, "measured": {"server": client.base, "model": client.model, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "note": "review before committing as reference_ids.json"}, "ids": got}
        Path(opts.record_golden).write_text(json.dumps(record, indent=1) + "\n")
    if ref is None:
        return Result("golden", "not measured", f"{len(prompts)} prompts run; no reference ids yet ({opts.golden_dir / 'reference_ids.json'})", {"ids": got})
    same, diffs = 0, {}
    for p in prompts:
        want = ref["ids"].get(p["id"])
        if want is None:
            diffs[p["id"]] = "no reference ids for this prompt"
            continue
        have = got[p["id"]]
        if have == want:
            same += 1
            continue
        pos = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
        diffs[p["id"]] = f"first difference at token {pos} (got {have[pos] if pos < len(have) else 'end'}, reference {want[pos] if pos < len(want) else 'end'})"
    res = "pass" if same == len(prompts) else "fail"
    return Result("golden", res, f"{same}/{len(prompts)} identical", {"differences": diffs})


# --------------------------------------------------------------------------- needles
DOORS = [("red", 0.10), ("green", 0.50), ("blue", 0.90)]


def needle_code(length: int, colour: str) -> str:
    return str(1000000 + int(hashlib.sha256(f"{length}:{colour}".encode()).hexdigest(), 16) % 9000000)


def needle_sentence(colour: str, code: str) -> str:
    return f"The access code for the {colour} door is {code}."


def answer_text(msg: dict) -> str:
    return (msg.get("content") or "").strip()


def gate_needles(client: Client, opts) -> Result:
    details, passed, total, sizes = {}, 0, 0, []
    for length in opts.needle_lengths:
        codes = {c: needle_code(length, c) for c, _ in DOORS}
        doc, tokens, counted = sized_document(client, length, seed=length, inserts=[(f, needle_sentence(c, codes[c])) for c, f in DOORS])
        sizes.append(("" if counted else "~") + kilo(tokens))
        for colour, frac in DOORS:
            total += 1
            q = f"{doc}\n\nWhat is the access code for the {colour} door? Answer with the code only."
            msg = client.chat([{"role": "user", "content": q}], max_tokens=opts.answer_tokens, chat_template_kwargs=opts.chat_kwargs)
            ans = answer_text(msg)
            others = [codes[c] for c, _ in DOORS if c != colour]
            ok = codes[colour] in ans and not any(o in ans for o in others)
            passed += ok
            details[f"{length}:{colour}@{int(frac * 100)}%"] = {"tokens": tokens, "counted": counted, "expected": codes[colour], "answer": ans[:200], "pass": ok}
    return Result("needles", "pass" if passed == total else "fail", f"{passed}/{total} at {', '.join(sizes)} tokens", details)


# --------------------------------------------------------------------------- tools
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "city name"}}, "required": ["city"]},
    },
}
ORDER = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order by its order number.",
        "parameters": {"type": "object", "properties": {"order_number": {"type": "string"}}, "required": ["order_number"]},
    },
}


def calls_of(msg: dict) -> list[tuple[str, dict]]:
    out = []
    for c in msg.get("tool_calls") or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {"__unparsed__": args}
        out.append((fn.get("name", ""), args if isinstance(args, dict) else {"__unparsed__": args}))
    return out


def _cities(calls) -> set[str]:
    return {str(a.get("city", "")).split(",")[0].strip().lower() for n, a in calls if n == "get_weather"}


def gate_tools(client: Client, opts) -> Result:
    kw = {"max_tokens": opts.answer_tokens, "chat_template_kwargs": opts.chat_kwargs, "tools": [WEATHER, ORDER], "tool_choice": "auto"}
    cases: dict[str, tuple[bool, str]] = {}

    def ask(messages, streamed):
        return client.chat_stream(messages, **kw) if streamed else client.chat(messages, **kw)

    for streamed in (False, True):
        tag = "streamed" if streamed else "not streamed"
        calls = calls_of(ask([{"role": "user", "content": "What is the weather in Paris right now?"}], streamed))
        cases[f"single, {tag}"] = (len(calls) == 1 and _cities(calls) == {"paris"}, f"calls {calls}")
        calls = calls_of(ask([{"role": "user", "content": "What is the weather in Paris and in Tokyo right now? Check both cities."}], streamed))
        cases[f"parallel, {tag}"] = (len(calls) == 2 and _cities(calls) == {"paris", "tokyo"}, f"calls {calls}")
        msg = ask([{"role": "user", "content": "What is 17 plus 25? Answer with the number only; no tool is needed."}], streamed)
        cases[f"no call, {tag}"] = (not calls_of(msg) and "42" in answer_text(msg), f"calls {calls_of(msg)}, answer {answer_text(msg)[:80]!r}")

    history = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"city": "Oslo", "temperature_c": 13, "sky": "overcast"})},
    ]
    msg = client.chat(history, **kw)
    cases["multi-turn"] = (not calls_of(msg) and "13" in answer_text(msg), f"calls {calls_of(msg)}, answer {answer_text(msg)[:120]!r}")

    order = "ZX-" + needle_code(opts.tool_doc_tokens, "order")
    doc, tokens, counted = sized_document(client, opts.tool_doc_tokens, seed=7, inserts=[(0.5, f"The customer's order number is {order}.")])
    msg = client.chat([{"role": "user", "content": f"{doc}\n\nLook up the customer's order mentioned in the document above."}], **kw)
    calls = calls_of(msg)
    ok = len(calls) == 1 and calls[0][0] == "lookup_order" and str(calls[0][1].get("order_number", "")).strip() == order
    cases[f"call after a {'' if counted else '~'}{kilo(tokens)}-token document"] = (ok, f"calls {calls}, expected lookup_order({order})")

    passed = sum(ok for ok, _ in cases.values())
    return Result("tools", "pass" if passed == len(cases) else "fail", f"{passed}/{len(cases)}", {k: {"pass": ok, "seen": s} for k, (ok, s) in cases.items()})


# --------------------------------------------------------------------------- images
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (30, 60, 220), "yellow": (240, 220, 30), "black": (0, 0, 0), "white": (255, 255, 255)}


def png(width: int, height: int, row) -> bytes:
    """A truecolour PNG from row(y) -> the row's RGB bytes (3 * width), standard library only."""
    raw = b"".join(b"\x00" + row(y) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def solid(colour: str, size: int = 336) -> str:
    line = bytes(COLOURS[colour]) * size
    return data_url(png(size, size, lambda y: line))


QUADRANTS = ["red", "green", "blue", "yellow"]  # top-left, top-right, bottom-left, bottom-right


def quadrants(size: int = 336) -> str:
    h = size // 2
    top = bytes(COLOURS[QUADRANTS[0]]) * h + bytes(COLOURS[QUADRANTS[1]]) * (size - h)
    bottom = bytes(COLOURS[QUADRANTS[2]]) * h + bytes(COLOURS[QUADRANTS[3]]) * (size - h)
    return data_url(png(size, size, lambda y: top if y < h else bottom))


def squares(n: int, size: int = 336) -> str:
    """n black squares on white, in a row, well apart."""
    side = 40
    gap = (size - n * side) // (n + 1)
    white, black = bytes(COLOURS["white"]), bytes(COLOURS["black"])
    plain = white * size
    marked = b"".join((black if any(gap + i * (side + gap) <= x < gap + i * (side + gap) + side for i in range(n)) else white) for x in range(size))
    top = (size - side) // 2
    return data_url(png(size, size, lambda y: marked if top <= y < top + side else plain))


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@functools.lru_cache(maxsize=1)
def image_cases() -> list[tuple[str, list, object]]:
    """(name, content parts, expectation): a colour name, a list of names in order, or a count."""
    ask_colour = "What single colour fills this image? Answer with one word."
    cases = [(f"solid {c}", [image_part(solid(c)), {"type": "text", "text": ask_colour}], c) for c in ("red", "green", "blue")]
    cases.append(("quadrants", [image_part(quadrants()), {"type": "text", "text": "Name the colour of each quadrant in the order top-left, top-right, bottom-left, bottom-right, as four words."}], list(QUADRANTS)))
    cases.append(("counting", [image_part(squares(3)), {"type": "text", "text": "How many black squares are in this image? Answer with a number."}], 3))
    cases.append(("text before", [{"type": "text", "text": "Here is an image. " + ask_colour}, image_part(solid("yellow"))], "yellow"))
    cases.append(("text after", [{"type": "text", "text": "Look at this:"}, image_part(solid("black")), {"type": "text", "text": "That was the image. " + ask_colour}], "black"))
    return cases


NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def judge_image(answer: str, expect) -> bool:
    """Colour names and numbers are matched as whole words ("colored" holds no "red")."""
    a = answer.lower()

    def at(word: str) -> int:
        m = re.search(rf"\b{word}\b", a)
        return m.start() if m else -1

    if isinstance(expect, int):
        nums = {int(x) for x in re.findall(r"\b\d+\b", a)} | {k for k, w in NUMBER_WORDS.items() if at(w) >= 0}
        return nums == {expect}
    if isinstance(expect, list):
        pos = [at(c) for c in expect]
        return all(p >= 0 for p in pos) and pos == sorted(pos)
    return at(expect) >= 0 and not any(at(c) >= 0 for c in COLOURS if c != expect)


def gate_images(client: Client, opts) -> Result:
    cases: dict[str, tuple[bool, str]] = {}
    for name, parts, expect in image_cases():
        msg = client.chat([{"role": "user", "content": parts}], max_tokens=opts.answer_tokens, chat_template_kwargs=opts.chat_kwargs)
        ans = answer_text(msg)
        cases[name] = (judge_image(ans, expect), f"expected {expect}, answer {ans[:120]!r}")
    five = [image_part(solid(c)) for c in ("red", "green", "blue", "yellow", "black")] + [{"type": "text", "text": "Describe these images."}]
    status, body = client.post_status("/v1/chat/completions", {"model": client.model, "messages": [{"role": "user", "content": five}], "max_tokens": 16, "temperature": 0})
    cases["5 images rejected"] = (status == 400, f"HTTP {status}: {str(body)[:160]}")
    passed = sum(ok for ok, _ in cases.values())
    return Result("images", "pass" if passed == len(cases) else "fail", f"{passed}/{len(cases)}", {k: {"pass": ok, "seen": s} for k, (ok, s) in cases.items()})


# --------------------------------------------------------------------------- decode and prefill
def timed_completion(client: Client, prompt: str, max_tokens: int, ignore_eos: bool) -> dict:
    """Stream one completion: time to the first token, first and last token arrival, tokens."""
    body = {"model": client.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    chunks, usage = 0, None
    for t, ev in client.stream("/v1/completions", body):
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices") or []:
            if ch.get("text"):
                chunks += 1
                first = first if first is not None else t
                last = t
    if first is None:
        raise GateError("the stream carried no tokens")
    tokens = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
    return {"ttft_s": first - t0, "first": first, "last": last, "tokens": tokens, "chunks": chunks}


def gate_decode(client: Client, opts) -> Result:
    details, figures, ok = {}, [], True
    for length, floor in zip(opts.decode_lengths, opts.decode_floors):
        warm, _, _ = sized_document(client, length, seed=10_000 + length)
        timed_completion(client, warm, opts.decode_tokens, True)  # compiles this shape
        prompt, tokens, counted = sized_document(client, length, seed=20_000 + length)
        m = timed_completion(client, prompt, opts.decode_tokens, True)
        span = m["last"] - m["first"]
        if m["tokens"] < 2 or span <= 0:
            raise GateError(f"decode at {length}: {m['tokens']} tokens in {span:.3f} s; cannot time decode")
        rate = (m["tokens"] - 1) / span
        passed = rate >= floor
        ok &= passed
        label = ("" if counted else "~") + kilo(tokens)
        figures.append(f"{label} {rate:.1f} tok/s (floor {floor:g})")
        details[label] = {"prompt_tokens": tokens, "decode_tokens": m["tokens"], "seconds": round(span, 3), "tokens_per_s": round(rate, 2), "floor": floor, "pass": passed}
    return Result("decode", "pass" if ok else "fail", "; ".join(figures), details)


def gate_prefill(client: Client, opts) -> Result:
    details, figures, label = {}, [], ""
    for length in opts.ttft_lengths:
        warm, _, _ = sized_document(client, length, seed=30_000 + length)
        timed_completion(client, warm, 2, False)
        prompt, tokens, counted = sized_document(client, length, seed=40_000 + length)
        m = timed_completion(client, prompt, 2, False)
        label = ("" if counted else "~") + kilo(tokens)
        figures.append(f"{label} {m['ttft_s']:.1f} s")
        details[label] = {"prompt_tokens": tokens, "ttft_s": round(m["ttft_s"], 3)}
    longest = details[label]
    ok = longest["ttft_s"] <= opts.ttft_limit
    longest["limit_s"] = opts.ttft_limit
    return Result("prefill", "pass" if ok else "fail", "; ".join(figures) + f" (limit {opts.ttft_limit:g} s at the longest)", details)


# --------------------------------------------------------------------------- scripts
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


def sinkhorn_command(sinkhorn_dir: Path) -> list[str] | None:
    """The kernel's device test, as its folder provides it: gate.py, a package run with
    python -m, run_gate.sh, or a pytest file test_device*.py."""
    py = sys.executable
    if (sinkhorn_dir / "gate.py").is_file():
        return [py, str(sinkhorn_dir / "gate.py")]
    if (sinkhorn_dir / "__main__.py").is_file() and (sinkhorn_dir / "__init__.py").is_file():
        return [py, "-m", sinkhorn_dir.name]
    if (sinkhorn_dir / "run_gate.sh").is_file():
        return ["bash", str(sinkhorn_dir / "run_gate.sh")]
    tests = sorted(sinkhorn_dir.glob("test_device*.py"))
    if tests:
        return [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *map(str, tests)]
    return None


def gate_sinkhorn(client: Client | None, opts) -> Result:
    cmd = opts.sinkhorn_cmd.split() if opts.sinkhorn_cmd else sinkhorn_command(opts.sinkhorn_dir)
    if cmd is None:
        return Result("sinkhorn", "missing", f"no gate.py, __main__.py, run_gate.sh or test_device*.py in {opts.sinkhorn_dir}")
    result, figures, details = run_script(cmd, opts.script_timeout, cwd=opts.sinkhorn_dir.parent if "-m" in cmd[:2] else None)
    return Result("sinkhorn", result, figures, details)


def gate_fix_scripts(client: Client | None, opts) -> list[Result]:
    scripts = sorted(p for p in opts.fix_gates_dir.glob("*.py") if not p.name.startswith("_"))
    if not scripts:
        return [Result("fixes", "missing", f"no scripts in {opts.fix_gates_dir}")]
    model = ""
    if client is not None:
        try:
            model = client.model
        except GateError:
            pass  # no server: scripts that need none still run
    env = dict(os.environ, GATE_BASE_URL=client.base if client else opts.base_url, GATE_MODEL=model)
    out = []
    for s in scripts:
        result, figures, details = run_script([sys.executable, str(s)], opts.script_timeout, env=env)
        out.append(Result(f"fix:{s.stem}", result, figures, details))
    return out


# --------------------------------------------------------------------------- driver
GATES = {
    "golden": gate_golden,
    "needles": gate_needles,
    "tools": gate_tools,
    "images": gate_images,
    "decode": gate_decode,
    "prefill": gate_prefill,
    "sinkhorn": gate_sinkhorn,
}
SERVER_GATES = {"golden", "needles", "tools", "images", "decode", "prefill", "fixes"}


def ints(text: str) -> list[int]:
    return [int(float(x[:-1]) * 1024) if x.lower().endswith("k") else int(x) for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=os.environ.get("GATE_BASE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", help="model id (default: the first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--only", help=f"comma-separated gates (default: all of {', '.join(ALL_GATES)})")
    p.add_argument("--json", type=Path, help="write the results here as JSON")
    p.add_argument("--strict", action="store_true", help="'not measured' and 'missing' fail too")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    p.add_argument("--golden-dir", type=Path, default=GOLDEN_DIR)
    p.add_argument("--record-golden", type=Path, metavar="PATH", help="write the golden token ids this server gives to PATH")
    p.add_argument("--needle-lengths", type=ints, default=ints("16K,63K,127K,239K"))
    p.add_argument("--tool-doc-tokens", type=lambda x: ints(x)[0], default=32768)
    p.add_argument("--answer-tokens", type=int, default=1024, help="max_tokens of each answer (reasoning included)")
    p.add_argument("--chat-kwargs", type=json.loads, default={"reasoning_effort": "low"}, help="chat_template_kwargs for the answer gates (JSON)")
    p.add_argument("--decode-lengths", type=ints, default=ints("2K,128K"))
    p.add_argument("--decode-floors", type=floats, default=floats("15,10"), help="tokens/s, one per decode length")
    p.add_argument("--decode-tokens", type=int, default=512)
    p.add_argument("--ttft-lengths", type=ints, default=ints("16K,64K,128K"))
    p.add_argument("--ttft-limit", type=float, default=120.0, help="seconds allowed at the longest TTFT length")
    p.add_argument("--sinkhorn-dir", type=Path, default=SINKHORN_DIR)
    p.add_argument("--sinkhorn-cmd", help="run this instead of looking in --sinkhorn-dir")
    p.add_argument("--fix-gates-dir", type=Path, default=FIX_GATES_DIR)
    p.add_argument("--script-timeout", type=float, default=3600.0)
    return p


def run_gates(opts) -> list[Result]:
    names = [g.strip() for g in opts.only.split(",")] if opts.only else list(ALL_GATES)
    unknown = [g for g in names if g not in ALL_GATES]
    if unknown:
        raise SystemExit(f"gates.py: unknown gate(s) {', '.join(unknown)}; known: {', '.join(ALL_GATES)}")
    if len(opts.decode_floors) != len(opts.decode_lengths):
        raise SystemExit("gates.py: --decode-floors needs one floor per --decode-lengths entry")
    client = Client(opts.base_url, opts.model, opts.timeout, opts.api_key) if SERVER_GATES & set(names) else None
    results: list[Result] = []
    for name in names:
        t0 = time.perf_counter()
        try:
            if name == "fixes":
                got = gate_fix_scripts(client, opts)
            else:
                got = [GATES[name](client, opts)]
        except GateError as exc:
            got = [Result(name, "error", str(exc)[:200], {"error": str(exc)})]
        if client is not None and client._model is not None:
            opts.model = client._model
        for r in got:
            r.seconds = round(time.perf_counter() - t0, 1)
            results.append(r)
            print(f"{r.gate}: {r.result}  {r.figures}", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = run_gates(opts)
    print(table(results))
    if opts.json:
        opts.json.write_text(json.dumps({"server": opts.base_url, "model": opts.model, "started": started, "gates": [asdict(r) for r in results]}, indent=1) + "\n")
    bad = {"fail", "error"} | ({"not measured", "missing"} if opts.strict else set())
    return 1 if any(r.result in bad for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
