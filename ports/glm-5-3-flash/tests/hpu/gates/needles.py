"""needles: three codes at 10, 50 and 90 % depth of a filler document, one question each."""

from __future__ import annotations

import hashlib

from .client import Client, Result
from .documents import kilo, sized_document

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
        doc, tokens, counted = sized_document(
            client, length, seed=length, inserts=[(f, needle_sentence(c, codes[c])) for c, f in DOORS]
        )
        sizes.append(("" if counted else "~") + kilo(tokens))
        for colour, frac in DOORS:
            total += 1
            q = f"{doc}\n\nWhat is the access code for the {colour} door? Answer with the code only."
            msg = client.chat(
                [{"role": "user", "content": q}], max_tokens=opts.answer_tokens, chat_template_kwargs=opts.chat_kwargs
            )
            ans = answer_text(msg)
            others = [codes[c] for c, _ in DOORS if c != colour]
            ok = codes[colour] in ans and not any(o in ans for o in others)
            passed += ok
            details[f"{length}:{colour}@{int(frac * 100)}%"] = {
                "tokens": tokens,
                "counted": counted,
                "expected": codes[colour],
                "answer": ans[:200],
                "pass": ok,
            }
    return Result(
        "needles", "pass" if passed == total else "fail", f"{passed}/{total} at {', '.join(sizes)} tokens", details
    )
