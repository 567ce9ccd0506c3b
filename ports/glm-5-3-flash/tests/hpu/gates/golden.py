"""golden: greedy prompts (golden/prompts.json) against token ids measured on a card
(golden/reference_ids.json); "not measured" while that file is absent."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .client import Client, GateError, Result

REFERENCE_IDS = "reference_ids.json"


def load_golden(golden_dir: Path, ids_name: str = REFERENCE_IDS) -> tuple[list[dict], dict | None]:
    """prompts.json: [{"id", "prompt", "max_tokens"}]. ``ids_name`` (reference_ids.json; written only
    from a measurement on a card): {"format": 1, "measured": {...where, when, image...}, "ids": {id: [token ids]}}."""
    prompts_path = golden_dir / "prompts.json"
    if not prompts_path.is_file():
        raise GateError(f"{prompts_path} is missing")
    prompts = json.loads(prompts_path.read_text())
    ids_path = golden_dir / ids_name
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
        raise GateError(
            "the server returned no choices[0].token_ids (vLLM's return_token_ids); cannot compare token ids"
        )
    return [int(i) for i in ids]


def gate_golden(client: Client, opts) -> Result:
    return golden_against(client, opts, "golden", REFERENCE_IDS, opts.record_golden)


def golden_against(client: Client, opts, gate: str, ids_name: str, record_path, same_model: bool = False) -> Result:
    """The golden prompts, greedy, against ``ids_name``; ``record_path`` writes what this server gave.
    ``same_model``: a reference measured on another model than the server's is "not measured"."""
    prompts, ref = load_golden(opts.golden_dir, ids_name)
    got = {p["id"]: completion_ids(client, p["prompt"], int(p.get("max_tokens", 64))) for p in prompts}
    if record_path:
        record = {
            "format": 1,
            "measured": {
                "server": client.base,
                "model": client.model,
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "note": f"review before committing as {ids_name}",
            },
            "ids": got,
        }
        Path(record_path).write_text(json.dumps(record, indent=1) + "\n")
    if ref is None:
        return Result(
            gate,
            "not measured",
            f"{len(prompts)} prompts run; no reference ids yet ({opts.golden_dir / ids_name})",
            {"ids": got},
        )
    measured_on = (ref.get("measured") or {}).get("model")
    if same_model and measured_on != client.model:
        return Result(
            gate,
            "not measured",
            f"the server serves {client.model!r}; {ids_name} was measured on {measured_on!r}",
            {"ids": got},
        )
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
        pos = next((i for i, (a, b) in enumerate(zip(have, want, strict=False)) if a != b), min(len(have), len(want)))
        diffs[p["id"]] = (
            f"first difference at token {pos} (got {have[pos] if pos < len(have) else 'end'}, reference {want[pos] if pos < len(want) else 'end'})"
        )
    res = "pass" if same == len(prompts) else "fail"
    return Result(gate, res, f"{same}/{len(prompts)} identical", {"differences": diffs})
