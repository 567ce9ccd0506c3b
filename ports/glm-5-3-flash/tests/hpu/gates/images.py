"""images: solid colours, quadrants, counting, text around the image; five images are refused."""

from __future__ import annotations

import base64
import functools
import re
import struct
import zlib

from .client import Client, Result
from .needles import answer_text

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "black": (0, 0, 0),
    "white": (255, 255, 255),
}


def png(width: int, height: int, row) -> bytes:
    """A truecolour PNG from row(y) -> the row's RGB bytes (3 * width), standard library only."""
    raw = b"".join(b"\x00" + row(y) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


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
    marked = b"".join(
        (black if any(gap + i * (side + gap) <= x < gap + i * (side + gap) + side for i in range(n)) else white)
        for x in range(size)
    )
    top = (size - side) // 2
    return data_url(png(size, size, lambda y: marked if top <= y < top + side else plain))


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@functools.lru_cache(maxsize=1)
def image_cases() -> list[tuple[str, list, object]]:
    """(name, content parts, expectation): a colour name, a list of names in order, or a count."""
    ask_colour = "What single colour fills this image? Answer with one word."
    cases = [
        (f"solid {c}", [image_part(solid(c)), {"type": "text", "text": ask_colour}], c)
        for c in ("red", "green", "blue")
    ]
    cases.append(
        (
            "quadrants",
            [
                image_part(quadrants()),
                {
                    "type": "text",
                    "text": "Name the colour of each quadrant in the order top-left, top-right, bottom-left, bottom-right, as four words.",
                },
            ],
            list(QUADRANTS),
        )
    )
    cases.append(
        (
            "counting",
            [
                image_part(squares(3)),
                {"type": "text", "text": "How many black squares are in this image? Answer with a number."},
            ],
            3,
        )
    )
    cases.append(
        (
            "text before",
            [{"type": "text", "text": "Here is an image. " + ask_colour}, image_part(solid("yellow"))],
            "yellow",
        )
    )
    cases.append(
        (
            "text after",
            [
                {"type": "text", "text": "Look at this:"},
                image_part(solid("black")),
                {"type": "text", "text": "That was the image. " + ask_colour},
            ],
            "black",
        )
    )
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
        msg = client.chat(
            [{"role": "user", "content": parts}], max_tokens=opts.answer_tokens, chat_template_kwargs=opts.chat_kwargs
        )
        ans = answer_text(msg)
        cases[name] = (judge_image(ans, expect), f"expected {expect}, answer {ans[:120]!r}")
    five = [image_part(solid(c)) for c in ("red", "green", "blue", "yellow", "black")] + [
        {"type": "text", "text": "Describe these images."}
    ]
    status, body = client.post_status(
        "/v1/chat/completions",
        {"model": client.model, "messages": [{"role": "user", "content": five}], "max_tokens": 16, "temperature": 0},
    )
    cases["5 images rejected"] = (status == 400, f"HTTP {status}: {str(body)[:160]}")
    passed = sum(ok for ok, _ in cases.values())
    return Result(
        "images",
        "pass" if passed == len(cases) else "fail",
        f"{passed}/{len(cases)}",
        {k: {"pass": ok, "seen": s} for k, (ok, s) in cases.items()},
    )
