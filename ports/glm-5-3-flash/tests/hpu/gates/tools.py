"""tools: single, parallel and no call, each streamed and not; multi-turn; a call after a long
document."""

from __future__ import annotations

import json

from .client import Client, Result
from .documents import kilo, sized_document
from .needles import answer_text, needle_code

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "city name"}},
            "required": ["city"],
        },
    },
}
ORDER = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order by its order number.",
        "parameters": {
            "type": "object",
            "properties": {"order_number": {"type": "string"}},
            "required": ["order_number"],
        },
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
    kw = {
        "max_tokens": opts.answer_tokens,
        "chat_template_kwargs": opts.chat_kwargs,
        "tools": [WEATHER, ORDER],
        "tool_choice": "auto",
    }
    cases: dict[str, tuple[bool, str]] = {}

    def ask(messages, streamed):
        return client.chat_stream(messages, **kw) if streamed else client.chat(messages, **kw)

    for streamed in (False, True):
        tag = "streamed" if streamed else "not streamed"
        calls = calls_of(ask([{"role": "user", "content": "What is the weather in Paris right now?"}], streamed))
        cases[f"single, {tag}"] = (len(calls) == 1 and _cities(calls) == {"paris"}, f"calls {calls}")
        calls = calls_of(
            ask(
                [
                    {
                        "role": "user",
                        "content": "What is the weather in Paris and in Tokyo right now? Check both cities.",
                    }
                ],
                streamed,
            )
        )
        cases[f"parallel, {tag}"] = (len(calls) == 2 and _cities(calls) == {"paris", "tokyo"}, f"calls {calls}")
        msg = ask(
            [{"role": "user", "content": "What is 17 plus 25? Answer with the number only; no tool is needed."}],
            streamed,
        )
        cases[f"no call, {tag}"] = (
            not calls_of(msg) and "42" in answer_text(msg),
            f"calls {calls_of(msg)}, answer {answer_text(msg)[:80]!r}",
        )

    history = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": json.dumps({"city": "Oslo", "temperature_c": 13, "sky": "overcast"}),
        },
    ]
    msg = client.chat(history, **kw)
    cases["multi-turn"] = (
        not calls_of(msg) and "13" in answer_text(msg),
        f"calls {calls_of(msg)}, answer {answer_text(msg)[:120]!r}",
    )

    order = "ZX-" + needle_code(opts.tool_doc_tokens, "order")
    doc, tokens, counted = sized_document(
        client, opts.tool_doc_tokens, seed=7, inserts=[(0.5, f"The customer's order number is {order}.")]
    )
    msg = client.chat(
        [{"role": "user", "content": f"{doc}\n\nLook up the customer's order mentioned in the document above."}], **kw
    )
    calls = calls_of(msg)
    ok = len(calls) == 1 and calls[0][0] == "lookup_order" and str(calls[0][1].get("order_number", "")).strip() == order
    cases[f"call after a {'' if counted else '~'}{kilo(tokens)}-token document"] = (
        ok,
        f"calls {calls}, expected lookup_order({order})",
    )

    passed = sum(ok for ok, _ in cases.values())
    return Result(
        "tools",
        "pass" if passed == len(cases) else "fail",
        f"{passed}/{len(cases)}",
        {k: {"pass": ok, "seen": s} for k, (ok, s) in cases.items()},
    )
