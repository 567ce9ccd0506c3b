"""The MTP decode levers on vllm-gaudi's own runner on the Habana emulation (development base, as
test_vllm_gaudi_emulation.py, whose tree, checkpoints and serving helper these tests use).
Emulated results, not a card's: the emulation counts the host reads of the card that a step
makes; it does not time them.

GLM_EARLY_DRAFT=1 (glm5_hpu/early_draft.py): a verify step's MTP draft runs on the card from the
rejection output before the step's tokens are read back, and both are read in one copy.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from packtests.mxfp4_runner import MTP, PORT, serve

pytestmark = pytest.mark.slow
SPEC = json.dumps({"method": "mtp", "num_speculative_tokens": 1})


def _after_instrument(body: str) -> str:
    """Python run first in the generate process that runs ``body`` right after the harness has
    instrumented the runner (vLLM and vllm-gaudi are importable then); each in a scope of its own,
    so several can be given one after another."""
    inner = textwrap.indent(body.strip(), " " * 8)
    return (
        "def _install():\n"
        "    import hpu_harness.instrument as instrument\n"
        "    previous = instrument.instrument_runner\n"
        "    def instrument_runner(phases=False):\n"
        "        previous(phases)\n"
        f"{inner}\n"
        "    instrument.instrument_runner = instrument_runner\n"
        "_install()\n"
    )


# Run in the generate process first: every call of the MTP drafter's propose (vllm-gaudi's
# HpuEagleProposer) is written to stderr with its inputs and its drafts. Read from the emulated
# card's memory directly (HPUTensor._elem), so the probe adds no host read to the counts.
PROPOSE_PROBE = _after_instrument("""
import json, sys
from vllm_gaudi.v1.spec_decode.hpu_eagle import HpuEagleProposer
propose = HpuEagleProposer.propose
def host(t):
    return getattr(t, "_elem", t)
def probe(self, token_ids, positions, hidden, last, *args, **kwargs):
    drafts = propose(self, token_ids, positions, hidden, last, *args, **kwargs)
    record = dict(
        tokens=host(token_ids).flatten().tolist(),
        positions=host(positions).flatten().tolist(),
        last=host(last).flatten().tolist(),
        hidden=[list(hidden.shape), float(host(hidden).double().sum())],
        drafts=host(drafts).flatten().tolist(),
    )
    print("PROPOSE " + json.dumps(record), file=sys.stderr, flush=True)
    return drafts
HpuEagleProposer.propose = probe
""")


def _proposals(proc) -> list[dict]:
    return [json.loads(line[len("PROPOSE ") :]) for line in proc.stderr.splitlines() if line.startswith("PROPOSE ")]


def _serve_mtp(release, model, monkeypatch, **switches):
    proc, result = serve(
        release,
        model,
        monkeypatch,
        engine_args=[f"speculative_config={SPEC}"],
        extra=MTP,
        prelude=PROPOSE_PROBE,
        **switches,
    )
    assert result is not None, proc.stderr[-6000:]
    return proc, result


def _line(path, text: str) -> str:
    """``path:N``, N the line of ``path`` that holds ``text`` (a read of the card the runner makes)."""
    lines = path.read_text().splitlines()
    (n,) = [i for i, line in enumerate(lines, 1) if text in line]
    return f"{path}:{n}"


def _sample_steps(result) -> list[tuple[dict, list[dict], dict]]:
    """Per engine step: its sample_tokens phase, the forwards and drafting inside it (counted as
    steps of their own, recorded before it), and the engine's take_draft_token_ids after it."""
    out: list = []
    inner: list = []
    for step in result["steps"]:
        if step["label"].startswith("sample"):
            out.append([step, inner, None])
            inner = []
        elif step["label"].startswith("take drafts"):
            out[-1][2] = step
        else:
            inner.append(step)
    assert all(take is not None for _, _, take in out)
    return [tuple(o) for o in out]


def _read_at(step: dict, site: str) -> bool:
    return any(s.split(" at ", 1)[1] == site for s in step["sync_sites"])


@pytest.fixture(scope="module")
def device_reject(tree, constant_draft):
    """MTP with GLM_SPEC_DEVICE_REJECT=1 and GLM_EARLY_DRAFT=0: vLLM's drafting after the step."""
    with pytest.MonkeyPatch.context() as mp:
        return _serve_mtp(tree, constant_draft, mp, GLM_SPEC_DEVICE_REJECT=1, GLM_EARLY_DRAFT=0)


def test_early_draft_keeps_every_output_and_reads_the_card_once_per_verify_step(
    tree,
    constant_draft,
    device_reject,
    monkeypatch,
):
    """GLM_EARLY_DRAFT=1 beside GLM_SPEC_DEVICE_REJECT=1 (the recipe's launch), the draft always token 0
    so drafts are both accepted and rejected: every output (greedy batched and alone, logprobs,
    seeded samples) and vLLM's speculative counters as with GLM_EARLY_DRAFT=0; the drafter runs on
    the same tokens, positions and hidden states and gives the same drafts, call for call. In each
    greedy verify step of decodes only, the card is read once instead of twice: vLLM's
    parse_output reading the rejection output and take_draft_token_ids reading the drafts after
    the step become glm5_hpu/early_draft.py's one read of both; every other read stays."""
    off_proc, off = device_reject
    on_proc, on = _serve_mtp(tree, constant_draft, monkeypatch, GLM_SPEC_DEVICE_REJECT=1, GLM_EARLY_DRAFT=1)
    for key in ("batched", "alone", "logprobs", "sampled", "sampled_again", "spec_decode"):
        assert on[key] == off[key], key
    counts = on["spec_decode"]
    assert 0 < counts["vllm:spec_decode_num_accepted_tokens"] < counts["vllm:spec_decode_num_draft_tokens"], counts
    calls_off, calls_on = _proposals(off_proc), _proposals(on_proc)
    assert calls_off and calls_on == calls_off
    # some verify step kept its draft: the request's last kept row is its second (odd index)
    assert any(last % 2 == 1 for call in calls_on if len(call["tokens"]) > len(call["last"]) for last in call["last"])

    parse = _line(tree / "vllm" / "v1" / "sample" / "rejection_sampler.py", "output_token_ids.cpu()")
    take = _line(tree / "vllm_gaudi" / "v1" / "worker" / "hpu_model_runner.py", "self._draft_token_ids.tolist()")
    steps_off, steps_on = _sample_steps(off), _sample_steps(on)
    assert len(steps_on) == len(steps_off)
    saved = 0
    for (s_off, inner_off, t_off), (s_on, _, t_on) in zip(steps_off, steps_on, strict=True):
        if not _read_at(s_off, parse):
            continue  # not a verify step with the rejection output on the card
        early = [x for x in s_on["sync_sites"] if "glm5_hpu/early_draft.py" in x]
        assert _read_at(t_off, take), t_off
        if any(x["label"].startswith("prefill") for x in inner_off):
            # prompts in the step too: their drafts after it; all are read there, as before
            assert _read_at(s_on, parse) and not early and _read_at(t_on, take), (s_on, t_on)
            continue
        assert not _read_at(s_on, parse) and len(early) == 1 and not _read_at(t_on, take), (s_on, t_on)
        saved += 1
    assert saved > 0
    total_off = sum(s["syncs"] for s in off["steps"])
    total_on = sum(s["syncs"] for s in on["steps"])
    assert total_on == total_off - saved, (total_off, total_on, saved)


# ------------------------------------------------------------------ drafting with chunked prefill
# A 90-token prompt first, then three short ones, all arriving together. Chunked: at most 64 tokens
# a step and 32 per request (long_prefill_token_threshold), so the long prompt's first chunk (32
# tokens, no logits) and the three short prompts (complete) are prefilled in the same step.
CHUNK_PROMPTS = [
    [(7 * i) % 255 + 1 for i in range(90)],
    [24, 124, 7, 228, 213, 99],
    [155, 195, 196, 0, 178, 114, 68, 184, 205],
    [47, 161, 185, 220],
]
CHUNKED = ["max_num_batched_tokens=64", "long_prefill_token_threshold=32"]

# Run in the generate process first: the drafts the runner hands to the scheduler after each step
# (take_draft_token_ids), with the requests they are paired with.
TAKE_PROBE = _after_instrument("""
import json, sys
from vllm_gaudi.v1.worker.hpu_model_runner import HPUModelRunner
take = HPUModelRunner.take_draft_token_ids
def probe(self):
    out = take(self)
    if out is not None:
        pairs = [list(out.req_ids), [[int(t) for t in d] for d in out.draft_token_ids]]
        print("TAKE " + json.dumps(pairs), file=sys.stderr, flush=True)
    return out
HPUModelRunner.take_draft_token_ids = probe
""")


def _serve_chunks(release, model, monkeypatch, *, mtp: bool, engine_args=()):
    spec = [f"speculative_config={SPEC}"] if mtp else []
    proc, result = serve(
        release,
        model,
        monkeypatch,
        alone=False,
        engine_args=[*spec, *engine_args],
        extra=["--prompts", json.dumps(CHUNK_PROMPTS)],
        prelude=TAKE_PROBE,
    )
    assert result is not None, proc.stderr[-6000:]
    return proc, result


def _first_drafts(proc) -> dict[int, list[int]]:
    """Per prompt (by its request's index), the first draft the scheduler got for it."""
    first: dict[int, list[int]] = {}
    for line in proc.stderr.splitlines():
        if line.startswith("TAKE "):
            req_ids, drafts = json.loads(line[len("TAKE ") :])
            for req_id, draft in zip(req_ids, drafts, strict=False):  # vLLM's scheduler zips them so
                first.setdefault(int(req_id.split("-")[0]), draft)
    return first


@pytest.fixture(scope="module")
def whole_prompts(tree, ckpt):
    """MTP (the random draft: its drafts differ from request to request), every prompt prefilled in
    one step."""
    with pytest.MonkeyPatch.context() as mp:
        return _serve_chunks(tree, ckpt[1], mp, mtp=True)


def test_chunked_prefill_alone_keeps_the_greedy_tokens(tree, ckpt, whole_prompts, monkeypatch):
    """The control for the test below: the same chunking without MTP gives the same greedy tokens as
    the unchunked MTP run."""
    _, result = _serve_chunks(tree, ckpt[1], monkeypatch, mtp=False, engine_args=CHUNKED)
    assert result["batched"] == whole_prompts[1]["batched"]


def test_drafting_with_chunked_prefill_keeps_drafts_and_greedy_tokens(tree, ckpt, whole_prompts, monkeypatch):
    """MTP with the long prompt's first chunk and three complete short prompts in one step: the
    runner hands one draft row per request, each short prompt's first draft is the one it gets
    unchunked, and the greedy tokens do not change. Without the port fix spec-chunked-prefill-drafts
    (vllm-gaudi 091bbad) propose_draft_token_ids took prefill batch idx's sampled token as
    prefill_sampled_token_ids[idx], a list without an entry for a batch that sampled nothing (a chunk
    that does not finish its prompt): every later batch drafted from the next batch's token, the
    last got no draft, and the scheduler zipped the short list of drafts with the requests (2 drafts
    for 4 requests, greedy tokens of two short prompts changed)."""
    whole_proc, whole = whole_prompts
    proc, result = _serve_chunks(tree, ckpt[1], monkeypatch, mtp=True, engine_args=CHUNKED)
    takes = [json.loads(line[len("TAKE ") :]) for line in proc.stderr.splitlines() if line.startswith("TAKE ")]
    assert takes and all(len(req_ids) == len(drafts) for req_ids, drafts in takes), takes
    want, got = _first_drafts(whole_proc), _first_drafts(proc)
    assert {i: got.get(i) for i in (1, 2, 3)} == {i: want[i] for i in (1, 2, 3)}
    assert result["batched"] == whole["batched"]


# ------------------------------------------------------------------ the MTP residual shape
# Run in the generate process first: the shapes going into and out of each call of vLLM's MTP layer.
MTP_SHAPES_PROBE = _after_instrument("""
import json, sys
from vllm.model_executor.models import deepseek_mtp
forward = deepseek_mtp.DeepSeekMultiTokenPredictorLayer.forward
def probe(self, input_ids, positions, previous_hidden_states, *args, **kwargs):
    out = forward(self, input_ids, positions, previous_hidden_states, *args, **kwargs)
    shapes = dict(previous=list(previous_hidden_states.shape), out=[list(o.shape) for o in out])
    print("MTPSHAPES " + json.dumps(shapes), file=sys.stderr, flush=True)
    return out
deepseek_mtp.DeepSeekMultiTokenPredictorLayer.forward = probe
""")
# The fix taken out (negative control): the port's MTP class builds the block as vLLM does.
NO_RESIDUAL_FIX = _after_instrument("""
import glm5_hpu.vllm_hpu
glm5_hpu.vllm_hpu.residual_shaped = lambda block: None
""")


def _mtp_shapes(proc) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in proc.stderr.splitlines() if line.startswith("MTPSHAPES ")]


def _drafts_by_request(proc) -> dict[int, list[list[int]]]:
    """Per request index, the drafts the scheduler got for it, in order."""
    got: dict[int, list[list[int]]] = {}
    for line in proc.stderr.splitlines():
        if line.startswith("TAKE "):
            req_ids, drafts = json.loads(line[len("TAKE ") :])
            for req_id, draft in zip(req_ids, drafts, strict=False):
                got.setdefault(int(req_id.split("-")[0]), []).append(draft)
    return got


def _serve_residual(release, model, monkeypatch, *, fixed: bool):
    prelude = TAKE_PROBE + MTP_SHAPES_PROBE + ("" if fixed else NO_RESIDUAL_FIX)
    proc, result = serve(
        release,
        model,
        monkeypatch,
        engine_args=[f"speculative_config={SPEC}"],
        extra=["--prompts", json.dumps(CHUNK_PROMPTS[1:])],
        prelude=f"import sys\nsys.path.insert(0, {str(PORT)!r})\n" + prelude,
    )
    assert result is not None, proc.stderr[-6000:]
    return proc, result


def _batched_drafts_equal_alone(proc, n: int) -> bool:
    """The three short prompts run batched (requests 0-2), then each alone (3-5): the drafts each
    request got batched equal those it got alone."""
    got = _drafts_by_request(proc)
    return all(got[i] == got[i + n] for i in range(n))


def test_mtp_layer_keeps_one_row_per_token_and_drafts_do_not_depend_on_the_batch(tree, ckpt, monkeypatch):
    """The MTP residual shape (README, port patches, row 6), with the random draft (drafts differ by
    request): every call of vLLM's MTP layer returns one row per input row (decode: [rows, 1,
    hidden], as its input), and each request's drafts batched equal its drafts alone. Without
    glm5_hpu.vllm_hpu.residual_shaped (the negative control) a decode batch of n rows comes out
    [n, n, hidden] and the batched drafts differ from the drafts alone."""
    proc, result = _serve_residual(tree, ckpt[1], monkeypatch, fixed=True)
    shapes = _mtp_shapes(proc)
    assert any(s["previous"][0] > 1 and s["previous"][1] == 1 for s in shapes), shapes  # a decode batch
    assert all(out == s["previous"] for s in shapes for out in s["out"]), shapes
    assert _batched_drafts_equal_alone(proc, 3)
    assert result["batched"] == result["alone"]

    bad_proc, bad = _serve_residual(tree, ckpt[1], monkeypatch, fixed=False)
    bad_shapes = _mtp_shapes(bad_proc)
    assert any(s["out"][0] != s["previous"] for s in bad_shapes), bad_shapes
    assert not _batched_drafts_equal_alone(bad_proc, 3)
    assert bad["batched"] == result["batched"]  # greedy verification keeps the tokens either way
