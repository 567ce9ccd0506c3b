"""Device gates of the glm-5-mxfp4 port: the third serving page's validation table, as a client
of a running server (launched as `fixpack recipe show --recipe recipes/zai-org/GLM-5.3-BF16/recipe.yaml`
prints). Standard library only, so it runs in the port image as it is.

    python3 -m fixpack.gates --port glm-5-mxfp4 --base-url http://127.0.0.1:8000 [--only needles,tools] [--json OUT]
    python3 glm53_gates.py ...                    # the same, from this folder

| gate | what it sends | passes when (the page's gate) |
|---|---|---|
| needles | 10 prompts of 16K to 126K tokens (sized with /tokenize), two fillers alternating, three codes at 10 / 50 / 90 % depth; one question per code | 30/30: each answer holds its code and neither other |
| gsm8k | the first 50 problems of a GSM8K test-split JSONL (--gsm8k FILE: {"question", "answer"} lines), reasoning low, greedy | at least 47/50 final answers equal |
| tools | required, named, auto, none and a JSON schema (8 cases), streamed and not, greedy and sampled: 32 requests | 32/32: calls parse, name a tool, hold their required arguments without markup; no call where none is allowed; the JSON matches its schema |
| mtp | 16 requests of 256 tokens at the server's default sampling; /metrics spec-decode counters before and after | accepted / drafted tokens at or above 0.70 |
| logprobs | 40 sampled requests with top_logprobs 5 (under MTP: the server's configuration) | 40/40 complete (finish_reason stop or length) with every token's logprob and its 5 alternatives finite |
| stress | 4 streamed decodes; while they run, 64K- and 100K-token prompts with three codes each | 4/4 decodes finished, 3/3 codes in both long answers; the largest gap between two decode chunks is reported |
| greedy | 16 prompts x 192 tokens, greedy, token ids (`return_token_ids`) | --greedy-record FILE on the launch configuration records; --greedy-compare FILE after a restart with levers off: 16/16 identical |
| mxk | (no server: one free card) the MXFP4 MoE kernels' own device test, kernels/mxfp4-moe/gate.py: the built ops against their CPU emulation | its exit code 0; 2 (cannot run there) is "not run" |

The page's seven run by default; mxk only when named (--only mxk), before the server takes the cards.

Each gate gives a Result (fixpack/gates/client.py: gate, result (pass, fail, error, not run,
recorded), figures, details). fixpack's one gate runner (fixpack/gates/runner.py) runs and
reports them, with this port's rule that a gate not run fails the run (STRICT).
Exit code: 0 when every selected gate passed (or recorded), 1 otherwise, 2 bad usage.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from fixpack.gates import runner
from fixpack.gates.client import Client, Result

PAGE_GATES = ["needles", "gsm8k", "tools", "mtp", "logprobs", "stress", "greedy"]
GATES = [*PAGE_GATES, "mxk"]
PORT_DIR = Path(__file__).resolve().parents[2]
MXK_GATE = PORT_DIR / "kernels" / "mxfp4-moe" / "gate.py"
DEPTHS = (0.10, 0.50, 0.90)
LABELS = ("amber", "cobalt", "scarlet")


# --------------------------------------------------------------------------- gates
def result(gate: str, ok: bool | None, figures: dict, details: list | None = None, status: str | None = None) -> Result:
    return Result(gate, status or ("pass" if ok else "fail"), figures, details or [])


def content_of(answer: dict) -> str:
    return (answer["choices"][0].get("message") or {}).get("content") or ""


# --------------------------------------------------------------------------- documents
FILLERS = (
    "The river bends twice before it reaches the old mill, where the stones are grey and the water runs slow. ",
    "A committee reviewed the quarterly ledger line by line, noting each transfer, each receipt and each delay. ",
)


def codes_for(seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    return {label: "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(7)) for label in LABELS}


def needle(label: str, code: str) -> str:
    return f"The access code for the {label} vault is {code}. "


def document(client: Client, tokens: int, filler: str, codes: dict[str, str]) -> str:
    """About ``tokens`` tokens of ``filler`` with each code at its depth (sized with /tokenize)."""
    per = max(1, client.tokens(filler * 8) // 8)
    n = max(len(DEPTHS) + 1, tokens // per)
    parts = [filler] * n
    for depth, label in zip(reversed(DEPTHS), reversed(LABELS), strict=True):  # from the back, so indices hold
        parts.insert(int(n * depth), needle(label, codes[label]))
    return "".join(parts)


def question(label: str) -> str:
    return f"What is the access code for the {label} vault? Answer with the code only."


def needle_lengths(low: int, high: int, count: int) -> list[int]:
    return [round(low + (high - low) * i / max(1, count - 1)) for i in range(count)]


LOW = {"reasoning_effort": "low"}


def gate_needles(client: Client, a) -> Result:
    right, details = 0, []
    lengths = needle_lengths(a.needle_min, a.needle_max, a.needle_prompts)
    for i, target in enumerate(lengths):
        codes = codes_for(1000 + i)
        doc = document(client, target, FILLERS[i % 2], codes)
        size = client.tokens(doc)
        for label in LABELS:
            answer = content_of(
                client.chat_reply(
                    [{"role": "user", "content": doc + "\n\n" + question(label)}],
                    temperature=0,
                    max_tokens=a.answer_tokens,
                    chat_template_kwargs=LOW,
                )
            )
            others = [c for k, c in codes.items() if k != label]
            ok = codes[label] in answer and not any(c in answer for c in others)
            right += ok
            details.append({"tokens": size, "depth": DEPTHS[LABELS.index(label)], "ok": ok, "answer": answer[-200:]})
    total = len(lengths) * len(LABELS)
    return result(
        "needles",
        right == total,
        {"right": right, "of": total, "tokens": [min(d["tokens"] for d in details), max(d["tokens"] for d in details)]},
        details,
    )


# --------------------------------------------------------------------------- GSM8K
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def number(text: str) -> str | None:
    """The final answer: after the last '####', else in the last \\boxed{}, else the last number."""
    for pattern in (r"####\s*([^\n]*)", r"\\boxed\{([^}]*)\}"):
        found = re.findall(pattern, text)
        if found:
            text = found[-1]
            break
    nums = NUMBER.findall(text)
    if not nums:
        return None
    value = nums[-1].replace(",", "")
    return value[:-2] if value.endswith(".0") else value


def gate_gsm8k(client: Client, a) -> Result:
    if not a.gsm8k:
        return result(
            "gsm8k", None, {}, ["give --gsm8k FILE: the GSM8K test split as JSONL (question, answer)"], "not run"
        )
    with open(a.gsm8k) as f:
        rows = [json.loads(line) for line in f if line.strip()][: a.gsm8k_count]
    right, details = 0, []
    for row in rows:
        want = number(row["answer"])
        prompt = (
            row["question"]
            + "\nSolve it step by step; write the final answer as a number on the last line after '####'."
        )
        answer = content_of(
            client.chat_reply(
                [{"role": "user", "content": prompt}],
                temperature=0,
                max_tokens=a.gsm8k_tokens,
                chat_template_kwargs=LOW,
            )
        )
        got = number(answer)
        right += got == want
        details.append({"want": want, "got": got, "ok": got == want})
    return result(
        "gsm8k",
        right >= a.gsm8k_gate and len(rows) == a.gsm8k_count,
        {"right": right, "of": len(rows), "gate": a.gsm8k_gate},
        details,
    )


# --------------------------------------------------------------------------- tools
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "web_search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
]
REQUIRED = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}
WEATHER = "What is the weather in Paris right now?"
ROME = "Tell me about the history of Rome."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number"}},
    "required": ["city", "temperature_c"],
    "additionalProperties": False,
}


def _named(name):
    return {"type": "function", "function": {"name": name}}


# (case, prompt, request fields, expectation)
TOOL_CASES = [
    ("required-weather", WEATHER, {"tool_choice": "required"}, ("calls", None)),
    ("required-no-need", ROME, {"tool_choice": "required"}, ("calls", None)),
    ("named-weather", WEATHER, {"tool_choice": _named("get_weather")}, ("one", "get_weather")),
    ("named-search", ROME, {"tool_choice": _named("web_search")}, ("one", "web_search")),
    ("auto-weather", WEATHER, {"tool_choice": "auto"}, ("one", "get_weather")),
    ("auto-no-need", ROME, {"tool_choice": "auto"}, ("none", None)),
    ("none", WEATHER, {"tool_choice": "none"}, ("none", None)),
    (
        "json-schema",
        "Give a plausible current weather report for Paris as JSON.",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "report", "schema": SCHEMA}}},
        ("json", None),
    ),
]


def _call_problem(call: dict) -> str | None:
    fn = call.get("function") or {}
    name = fn.get("name")
    if name not in REQUIRED:
        return f"unknown tool {name!r}"
    try:
        args = json.loads(fn.get("arguments") or "")
    except ValueError:
        return f"{name}: arguments are not JSON: {fn.get('arguments')!r}"
    if not isinstance(args, dict):
        return f"{name}: arguments are not an object"
    for key in REQUIRED[name]:
        value = args.get(key)
        if not isinstance(value, str) or not value.strip():
            return f"{name}: argument {key!r} missing or empty"
        if "</" in value or "<arg" in value:
            return f"{name}: argument {key!r} holds markup: {value!r}"
    return None


def tool_problem(expect: tuple, message: dict) -> str | None:
    kind, name = expect
    calls = message.get("tool_calls") or []
    if kind == "none":
        if calls:
            return f"{len(calls)} tool call(s) where none is allowed"
        return None if (message.get("content") or "").strip() else "empty answer"
    if kind == "json":
        try:
            obj = json.loads(message.get("content") or "")
        except ValueError:
            return f"not JSON: {(message.get('content') or '')[:200]!r}"
        if not isinstance(obj, dict) or set(obj) != set(SCHEMA["properties"]):
            return f"keys {sorted(obj) if isinstance(obj, dict) else type(obj).__name__}, schema {sorted(SCHEMA['properties'])}"
        if (
            not isinstance(obj["city"], str)
            or isinstance(obj["temperature_c"], bool)
            or not isinstance(obj["temperature_c"], (int, float))
        ):
            return "a value of the wrong type"
        return None
    if not calls:
        return "no tool call"
    for call in calls:
        problem = _call_problem(call)
        if problem:
            return problem
    if kind == "one" and (len(calls) != 1 or calls[0]["function"]["name"] != name):
        return f"expected one call to {name}, got {[c['function']['name'] for c in calls]}"
    return None


def gate_tools(client: Client, a) -> Result:
    right, details = 0, []
    for stream in (False, True):
        for sampled in (False, True):
            for case, prompt, fields, expect in TOOL_CASES:
                kw = dict(fields, max_tokens=a.tool_tokens, chat_template_kwargs=LOW)
                if "response_format" not in fields:
                    kw["tools"] = TOOLS
                if not sampled:
                    kw["temperature"] = 0
                messages = [{"role": "user", "content": prompt}]
                try:
                    answer = client.chat_stream_reply(messages, **kw) if stream else client.chat_reply(messages, **kw)
                    problem = tool_problem(expect, answer["choices"][0]["message"])
                except Exception as exc:  # one request's failure is that case's failure
                    problem = f"{type(exc).__name__}: {exc}"
                right += problem is None
                details.append(
                    {"case": case, "stream": stream, "sampled": sampled, "ok": problem is None, "problem": problem}
                )
    return result("tools", right == len(details), {"right": right, "of": len(details)}, details)


# --------------------------------------------------------------------------- MTP
SPEC = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_drafts")


def counters(text: str) -> dict[str, float]:
    """Spec-decode counters from Prometheus text, summed over label sets (``_total`` or not)."""
    out = dict.fromkeys(SPEC, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = re.split(r"[{\s]", line, maxsplit=1)[0]
        base = name.removesuffix("_total")
        if base in out:
            out[base] += float(line.rsplit(None, 1)[-1])
    return out


PROMPTS = [
    "Explain how a bicycle gear system works.",
    "Write a short story about a lighthouse keeper.",
    "Summarise the causes of the French Revolution.",
    "Describe how photosynthesis stores energy.",
    "List ten uses for a paperclip and explain each.",
    "Explain the difference between TCP and UDP.",
    "Write a letter to a neighbour about a shared garden.",
    "How does a refrigerator move heat?",
    "Describe the water cycle for a ten-year-old.",
    "Compare merge sort and quicksort.",
    "What makes a good unit test? Give examples.",
    "Explain compound interest with a worked example.",
    "Write a recipe for vegetable soup with steps.",
    "How do vaccines train the immune system?",
    "Describe a day in the life of a medieval blacksmith.",
    "Explain why the sky is blue.",
]


def gate_mtp(client: Client, a) -> Result:
    before = counters(client.get_text("/metrics"))
    for prompt in PROMPTS[: a.mtp_requests]:
        client.chat_reply(
            [{"role": "user", "content": prompt}], max_tokens=a.mtp_tokens
        )  # the server's default sampling
    after = counters(client.get_text("/metrics"))
    drafted = after[SPEC[0]] - before[SPEC[0]]
    accepted = after[SPEC[1]] - before[SPEC[1]]
    drafts = after[SPEC[2]] - before[SPEC[2]]
    if drafted <= 0:
        return result(
            "mtp",
            False,
            {"drafts": drafts},
            ["no draft tokens counted: is the server running MTP (--speculative-config)?"],
        )
    rate = accepted / drafted
    return result(
        "mtp",
        rate >= a.mtp_gate,
        {
            "acceptance": round(rate, 3),
            "drafts": int(drafts),
            "draft_tokens": int(drafted),
            "accepted_tokens": int(accepted),
            "gate": a.mtp_gate,
        },
    )


# --------------------------------------------------------------------------- logprobs
def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def logprob_problem(answer: dict, top: int) -> str | None:
    choice = answer["choices"][0]
    if choice.get("finish_reason") not in ("stop", "length"):
        return f"finish_reason {choice.get('finish_reason')!r}"
    entries = ((choice.get("logprobs") or {}).get("content")) or []
    if not entries:
        return "no logprobs"
    want = (answer.get("usage") or {}).get("completion_tokens")
    if want is not None and len(entries) != want:
        return f"{len(entries)} logprob entries for {want} tokens"
    for i, e in enumerate(entries):
        alts = e.get("top_logprobs") or []
        if not _finite(e.get("logprob")) or len(alts) != top or not all(_finite(t.get("logprob")) for t in alts):
            return f"token {i}: logprob {e.get('logprob')!r}, {len(alts)} alternatives"
    return None


def gate_logprobs(client: Client, a) -> Result:
    right, details = 0, []
    for i in range(a.logprobs_requests):
        prompt = PROMPTS[i % len(PROMPTS)]
        try:
            answer = client.chat_reply(
                [{"role": "user", "content": prompt}],
                logprobs=True,
                top_logprobs=a.top_logprobs,
                max_tokens=a.logprobs_tokens,
                seed=i,
            )
            problem = logprob_problem(answer, a.top_logprobs)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        right += problem is None
        details.append({"request": i, "ok": problem is None, "problem": problem})
    return result("logprobs", right == a.logprobs_requests, {"right": right, "of": a.logprobs_requests}, details)


# --------------------------------------------------------------------------- stress
def gate_stress(client: Client, a) -> Result:
    decodes: list[dict] = [{} for _ in range(a.stress_decodes)]
    started = threading.Barrier(a.stress_decodes + 1)

    def decode(i):
        times, finish, first = [], None, True
        try:
            for t, chunk in client.stream(
                "/v1/completions",
                {
                    "model": client.model,
                    "prompt": PROMPTS[i % len(PROMPTS)] * 40,
                    "max_tokens": a.stress_tokens,
                    "ignore_eos": True,
                    "temperature": 0,
                },
            ):
                if first:
                    first = False
                    started.wait()
                times.append(t)
                finish = (chunk.get("choices") or [{}])[0].get("finish_reason") or finish
        except Exception as exc:
            decodes[i]["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            if first:
                started.abort()
        decodes[i].update(times=times, finish=finish)

    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(a.stress_decodes)]
    for t in threads:
        t.start()
    try:
        started.wait(timeout=a.timeout)
    except threading.BrokenBarrierError:
        pass
    long_start = time.perf_counter()
    longs = []
    for j, target in enumerate(a.stress_lengths):
        codes = codes_for(5000 + j)
        longs.append((target, codes))
    found = [None] * len(longs)

    def prefill(j):
        target, codes = longs[j]
        doc = document(client, target, FILLERS[j % 2], codes)
        ask = "\n\nList the access codes of the amber, cobalt and scarlet vaults, one per line."
        try:
            answer = content_of(
                client.chat_reply(
                    [{"role": "user", "content": doc + ask}],
                    temperature=0,
                    max_tokens=a.answer_tokens,
                    chat_template_kwargs=LOW,
                )
            )
            found[j] = sum(code in answer for code in codes.values())
        except Exception:
            found[j] = 0

    pre = [threading.Thread(target=prefill, args=(j,), daemon=True) for j in range(len(longs))]
    for t in pre:
        t.start()
    for t in pre:
        t.join(a.timeout)
    long_end = time.perf_counter()
    for t in threads:
        t.join(a.timeout)
    gap = 0.0
    for d in decodes:
        ts = d.get("times") or []
        # neighbours (strict=False: ts[1:] is one shorter)
        gap = max([gap] + [b - x for x, b in zip(ts, ts[1:], strict=False) if b >= long_start and x <= long_end])
    finished = sum(1 for d in decodes if d.get("finish") in ("length", "stop") and not d.get("error"))
    needles = [f or 0 for f in found]
    ok = finished == a.stress_decodes and all(n == len(LABELS) for n in needles)
    return result(
        "stress",
        ok,
        {
            "finished": finished,
            "of": a.stress_decodes,
            "needles": needles,
            "largest_decode_gap_s": round(gap, 3),
            "long_prompts": list(a.stress_lengths),
        },
        [
            {"decode": i, "finish": d.get("finish"), "chunks": len(d.get("times") or []), "error": d.get("error")}
            for i, d in enumerate(decodes)
        ],
    )


# --------------------------------------------------------------------------- greedy
def greedy_ids(client: Client, a) -> list[list[int]]:
    out = []
    for prompt in PROMPTS[: a.greedy_prompts]:
        answer = client.post(
            "/v1/completions",
            {
                "model": client.model,
                "prompt": prompt,
                "max_tokens": a.greedy_tokens,
                "temperature": 0,
                "return_token_ids": True,
            },
        )
        ids = answer["choices"][0].get("token_ids")
        if not isinstance(ids, list):
            raise RuntimeError("the server returned no token_ids (vLLM's return_token_ids)")
        out.append(ids)
    return out


def gate_greedy(client: Client, a) -> Result:
    if bool(a.greedy_record) == bool(a.greedy_compare):
        return result(
            "greedy",
            None,
            {},
            [
                "give --greedy-record FILE (launch configuration), then, after a restart "
                "with the levers off, --greedy-compare FILE"
            ],
            "not run",
        )
    ids = greedy_ids(client, a)
    if a.greedy_record:
        with open(a.greedy_record, "w") as f:
            json.dump({"prompts": PROMPTS[: a.greedy_prompts], "max_tokens": a.greedy_tokens, "token_ids": ids}, f)
        return result("greedy", None, {"prompts": len(ids), "tokens": a.greedy_tokens}, [], "recorded")
    with open(a.greedy_compare) as f:
        ref = json.load(f)
    if ref.get("prompts") != PROMPTS[: a.greedy_prompts] or ref.get("max_tokens") != a.greedy_tokens:
        return result("greedy", False, {}, [f"{a.greedy_compare} was recorded with other prompts or lengths"])
    # strict=False throughout: a recording may hold fewer prompts or other lengths; both are reported below
    same = [x == y for x, y in zip(ids, ref["token_ids"], strict=False)]
    first = [
        next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        for x, y in zip(ids, ref["token_ids"], strict=False)
    ]
    return result(
        "greedy",
        all(same) and len(same) == len(ids),
        {"identical": sum(same), "of": len(ids)},
        [{"prompt": i, "identical": s, "first_difference": None if s else first[i]} for i, s in enumerate(same)],
    )


def gate_mxk(client: Client, a) -> Result:
    """The kernels' own device test, run as a script (it needs a card, not the server); the port
    folder goes on PYTHONPATH so glm5_hpu imports from a checkout as well as from the image."""
    script = Path(a.mxk_gate)
    if not script.is_file():
        return result("mxk", None, {}, [f"{script}: no such file"], "not run")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(PORT_DIR), os.environ.get("PYTHONPATH", "")) if p)
    )
    try:
        proc = subprocess.run(
            [a.mxk_python, str(script)], capture_output=True, text=True, env=env, timeout=a.mxk_timeout
        )
    except subprocess.TimeoutExpired:
        return result("mxk", None, {"timeout_s": a.mxk_timeout}, [], "error")
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    status = {0: "pass", 1: "fail", 2: "not run"}.get(proc.returncode, "error")
    return result("mxk", None, {"exit": proc.returncode, "summary": lines[-1] if lines else ""}, lines[-60:], status)


GATES = {
    "needles": gate_needles,
    "gsm8k": gate_gsm8k,
    "tools": gate_tools,
    "mtp": gate_mtp,
    "logprobs": gate_logprobs,
    "stress": gate_stress,
    "greedy": gate_greedy,
    "mxk": gate_mxk,
}
DEFAULT = PAGE_GATES
NO_SERVER = {"mxk"}
STRICT = True  # a page gate that did not run has not passed
TIMEOUT = 3600.0


# --------------------------------------------------------------------------- options
def add_arguments(p) -> None:
    p.add_argument("--needle-prompts", type=int, default=10)
    p.add_argument("--needle-min", type=int, default=16384)
    p.add_argument("--needle-max", type=int, default=126 * 1024)
    p.add_argument("--answer-tokens", type=int, default=1024)
    p.add_argument("--gsm8k", help="GSM8K test split, JSONL with question and answer")
    p.add_argument("--gsm8k-count", type=int, default=50)
    p.add_argument("--gsm8k-gate", type=int, default=47)
    p.add_argument("--gsm8k-tokens", type=int, default=4096)
    p.add_argument("--tool-tokens", type=int, default=1024)
    p.add_argument("--mtp-requests", type=int, default=16)
    p.add_argument("--mtp-tokens", type=int, default=256)
    p.add_argument("--mtp-gate", type=float, default=0.70)
    p.add_argument("--logprobs-requests", type=int, default=40)
    p.add_argument("--logprobs-tokens", type=int, default=128)
    p.add_argument("--top-logprobs", type=int, default=5)
    p.add_argument("--stress-decodes", type=int, default=4)
    p.add_argument("--stress-tokens", type=int, default=2048)
    p.add_argument("--stress-lengths", type=lambda s: [int(x) for x in s.split(",")], default=[65536, 102400])
    p.add_argument("--greedy-prompts", type=int, default=16)
    p.add_argument("--greedy-tokens", type=int, default=192)
    p.add_argument("--greedy-record", help="record the greedy token ids here (launch configuration)")
    p.add_argument("--greedy-compare", help="compare with ids recorded by --greedy-record")
    p.add_argument("--mxk-gate", default=str(MXK_GATE), help="the kernels' device test (mxk)")
    p.add_argument(
        "--mxk-python", default=sys.executable, help="the interpreter that runs it (the image's, with Gaudi software)"
    )
    p.add_argument("--mxk-timeout", type=float, default=1800.0)


def check(a) -> str | None:
    if len(PROMPTS) < max(a.greedy_prompts, a.mtp_requests):
        return f"at most {len(PROMPTS)} prompts for greedy and mtp"
    return None


def parser():
    return runner.parser(sys.modules[__name__], prog="glm53_gates.py")


def main(argv: list[str] | None = None) -> int:
    return runner.main(sys.modules[__name__], argv, prog="glm53_gates.py")


if __name__ == "__main__":
    raise SystemExit(main())
