"""Filler documents of a given token length, sized with the server's /tokenize."""

from __future__ import annotations

import random

from .client import Client

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


def sized_document(
    client: Client, target_tokens: int, seed: int, inserts: list[tuple[float, str]] = ()
) -> tuple[str, int, bool]:
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
