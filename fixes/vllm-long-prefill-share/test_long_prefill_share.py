"""VLLM_LONG_PREFILL_SHARE=F with --long-prefill-token-threshold: while other requests
decode, prompts longer than VLLM_LONG_PREFILL_MIN_TOKENS together take at most F of each
step's token budget, so decodes (and short requests arriving meanwhile) keep moving.

Driven on the real vLLM Scheduler (and AsyncScheduler) of the tree, built from a real
VllmConfig (a one-layer Llama config on the CPU platform), a real KV cache config and
real Requests; the model runner's output is one sampled token per request whose prompt
is complete. The stress shape: decodes running while a 64K- and a 100K-token prompt
prefill, and two short requests arriving in the middle of it."""

import hashlib
import importlib.util
import json
import sys

import pytest

BLOCK = 16
BUDGET = 2048  # --max-num-batched-tokens
THRESHOLD = 1024  # --long-prefill-token-threshold
SHARE = "0.25"
CAP = int(0.25 * BUDGET)  # the long prompts' tokens per step while others decode
LONG = {"long64k": 65536, "long100k": 102400}
MAX_MODEL_LEN = 110_000
NUM_BLOCKS = 12_000  # room for both long prompts and the decodes
ENV = ("VLLM_LONG_PREFILL_SHARE", "VLLM_LONG_PREFILL_MIN_TOKENS", "VLLM_LONG_PREFILL_SHARE_ASYNC")


@pytest.fixture(scope="module")
def vllm_env(tree, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_TARGET_DEVICE", "cpu")  # the CPU platform: no accelerator here
    mp.setenv("HF_HUB_OFFLINE", "1")
    for name in ENV:
        mp.delenv(name, raising=False)
    model_dir = tmp_path_factory.mktemp("tiny_llama")
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "vocab_size": 256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    }))
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.model_executor.models.registry import ModelRegistry

    # Registered in this process, so ModelConfig inspects the class here instead of in a
    # subprocess that would not see the tree under test.
    ModelRegistry.register_model("LlamaForCausalLM", LlamaForCausalLM)
    yield model_dir
    mp.undo()


def make_scheduler(model_dir, monkeypatch, env=None, async_scheduling=False, threshold=THRESHOLD, cls=None):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True,
                               max_model_len=MAX_MODEL_LEN, dtype="bfloat16")
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=BUDGET, max_num_seqs=16, max_model_len=MAX_MODEL_LEN,
        long_prefill_token_threshold=threshold, enable_chunked_prefill=True,
        is_encoder_decoder=False, async_scheduling=async_scheduling,
    )
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=False)
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=cache_config)
    # The CPU platform turns async scheduling off (the HPU platform keeps it).
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=4, head_size=16, dtype=torch.bfloat16))],
    )
    if cls is None:
        cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=BLOCK,
               structured_output_manager=StructuredOutputManager(vllm_config),
               log_stats=False)


def request(req_id, prompt_len, max_tokens):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(req_id, [(i * 7 + 3) % 256 for i in range(prompt_len)], params, None)


def stress_arrivals():
    """{step: requests}: two decodes first, both long prompts together at step 2, two
    short requests arriving at step 5 (behind the long prompts in the queues)."""
    return {
        0: [request("dec0", 32, 4000), request("dec1", 40, 4000)],
        2: [request("long64k", LONG["long64k"], 2), request("long100k", LONG["long100k"], 2)],
        5: [request("dec2", 24, 4000), request("dec3", 48, 4000)],
    }


def drive(scheduler, arrivals, stop_when_finished=tuple(LONG), max_steps=2000):
    """Run steps until the named requests finished. Returns one record per step: the
    requests decoding before it, the tokens it scheduled per request, and each long
    prompt's tokens still to prefill before it."""
    from vllm.v1.outputs import ModelRunnerOutput

    finished = set()
    trace = []
    for step in range(max_steps):
        for req in arrivals.get(step, ()):
            scheduler.add_request(req)
        decoding = sorted(r.request_id for r in scheduler.running if not r.is_prefill_chunk)
        remaining = {r.request_id: r.num_prompt_tokens - r.num_computed_tokens
                     for r in list(scheduler.running) + list(scheduler.waiting) + list(scheduler.skipped_waiting)
                     if r.request_id in LONG}
        out = scheduler.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        trace.append({"step": step, "decoding": decoding, "scheduled": scheduled, "long_left": remaining})
        req_ids = list(scheduled)
        sampled = []
        for rid in req_ids:
            r = scheduler.requests[rid]
            sampled.append([11] if r.num_computed_tokens >= r.num_tokens else [])
        engine_outputs = scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled))
        for outputs in engine_outputs.values():
            finished.update(o.request_id for o in outputs.outputs if o.finished)
        if set(stop_when_finished) <= finished:
            return trace, finished
    raise AssertionError(f"{sorted(set(stop_when_finished) - finished)} did not finish in {max_steps} steps")


def assert_share_held(trace):
    long_steps = 0
    for rec in trace:
        sched, left = rec["scheduled"], rec["long_left"]
        prefilling = {rid: n for rid, n in left.items() if n > 0}
        # A long prompt's tokens while it prefills (its decode steps are decodes).
        long_tokens = sum(n for rid, n in sched.items() if rid in prefilling)
        if rec["decoding"] and prefilling:
            long_steps += 1
            # The share is held, and used: the long prompts take all of it they can.
            assert long_tokens <= CAP, (
                f"step {rec['step']}: the long prompts took {long_tokens} of {BUDGET} tokens "
                f"while {rec['decoding']} decode; the share allows {CAP}"
            )
            assert long_tokens == min(CAP, sum(prefilling.values())), (
                f"step {rec['step']}: the long prompts took {long_tokens}, not "
                f"min({CAP}, {sum(prefilling.values())}): the share is not used"
            )
        missing = [rid for rid in rec["decoding"] if rid not in sched]
        assert not missing, f"step {rec['step']}: running decodes {missing} were not scheduled"
    return long_steps


def first_step(trace, rid):
    return next(rec["step"] for rec in trace if rid in rec["scheduled"])


def test_share_held_while_decodes_run(vllm_env, monkeypatch):
    scheduler = make_scheduler(vllm_env, monkeypatch, env={"VLLM_LONG_PREFILL_SHARE": SHARE})
    trace, finished = drive(scheduler, stress_arrivals())
    assert set(LONG) <= finished  # both long prompts still finish
    long_steps = assert_share_held(trace)
    assert long_steps >= sum(LONG.values()) // CAP  # the share held over the whole prefill
    # Short requests arriving during the long prefill are admitted at once and decode.
    for rid in ("dec2", "dec3"):
        assert first_step(trace, rid) == 5, f"{rid} waited behind the long prompts"
    assert all({"dec0", "dec1", "dec2", "dec3"} <= set(rec["decoding"]) for rec in trace[7:])


def test_share_with_custom_min_tokens(vllm_env, monkeypatch):
    # Only the 100K prompt is long with a 70K threshold of "long": the 64K one is chunked
    # by --long-prefill-token-threshold alone.
    env = {"VLLM_LONG_PREFILL_SHARE": "0.125", "VLLM_LONG_PREFILL_MIN_TOKENS": "70000"}
    scheduler = make_scheduler(vllm_env, monkeypatch, env=env)
    trace, finished = drive(scheduler, stress_arrivals())
    cap = int(0.125 * BUDGET)
    shared = [rec for rec in trace if rec["decoding"] and rec["long_left"].get("long100k", 0) > 0]
    assert shared
    for rec in shared:
        got = rec["scheduled"].get("long100k", 0)
        assert got <= cap, f"step {rec['step']}: the 100K prompt took {got} tokens, the share allows {cap}"
    assert max(rec["scheduled"].get("long64k", 0) for rec in trace) == THRESHOLD


def load_pristine_scheduler_module():
    """vLLM's scheduler.py from the release sources in fixpack's cache, checked against the
    profile's manifest, loaded under its own name: the release's behaviour beside the
    tree's."""
    from fixpack.pack.pack import default_pack_root
    from fixpack.sources import sources

    manifest = json.loads((default_pack_root() / "profiles" / "v0.30.0.manifest.json").read_text())
    rel = "v1/core/sched/scheduler.py"
    path = sources.package_tree("vllm", manifest["sources"]["vllm"]) / "vllm" / rel
    assert hashlib.sha256(path.read_bytes()).hexdigest() == manifest["files"]["vllm"][rel]
    name = "fixpack_release_vllm_scheduler"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_unset_schedules_exactly_as_the_release(vllm_env, monkeypatch):
    """Regression guard: without VLLM_LONG_PREFILL_SHARE every step is the release's."""
    release = load_pristine_scheduler_module()
    got, _ = drive(make_scheduler(vllm_env, monkeypatch), stress_arrivals())
    want, _ = drive(make_scheduler(vllm_env, monkeypatch, cls=release.Scheduler), stress_arrivals())
    assert got == want
    # The release lets the long prompts take the whole budget: the stress is real.
    assert max(sum(n for rid, n in rec["scheduled"].items() if rid in LONG) for rec in want) > CAP


def test_no_decodes_no_share(vllm_env, monkeypatch):
    """Regression guard: with the share set but nothing decoding, long prompts take the
    budget as in the release."""
    release = load_pristine_scheduler_module()
    def arrivals():
        return {0: [request("long64k", LONG["long64k"], 2), request("long100k", LONG["long100k"], 2)]}

    env = {"VLLM_LONG_PREFILL_SHARE": SHARE}
    got, _ = drive(make_scheduler(vllm_env, monkeypatch, env=env), arrivals())
    want, _ = drive(make_scheduler(vllm_env, monkeypatch, env=env, cls=release.Scheduler), arrivals())
    # Until the 64K prompt has sampled its token and decodes, nothing else decodes.
    first_decode = next(i for i, rec in enumerate(want) if rec["decoding"])
    assert first_decode > 10
    assert got[:first_decode] == want[:first_decode]


def async_scheduler_cls(name):
    if name == "vllm":
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        return AsyncScheduler
    # vllm-gaudi rebinds vLLM's AsyncScheduler to this subclass (vllm_gaudi/utils.py); its
    # schedule() adds to the base class's, so the share is vLLM's code in effect there too.
    from vllm_gaudi.v1.core.sched.hpu_async_scheduler import HPUAsyncScheduler

    return HPUAsyncScheduler


@pytest.mark.parametrize("which", ["vllm", "vllm_gaudi"])
def test_async_scheduler_needs_its_switch(vllm_env, monkeypatch, which):
    """Regression guard: with async scheduling the share applies only with
    VLLM_LONG_PREFILL_SHARE_ASYNC=1; without it the schedule is that of an unset share."""
    cls = async_scheduler_cls(which)
    unset, _ = drive(make_scheduler(vllm_env, monkeypatch, async_scheduling=True, cls=cls), stress_arrivals())
    env = {"VLLM_LONG_PREFILL_SHARE": SHARE}
    got, _ = drive(make_scheduler(vllm_env, monkeypatch, env=env, async_scheduling=True, cls=cls), stress_arrivals())
    assert got == unset
    # The release's stress: the long prompts take the whole budget.
    assert max(sum(n for rid, n in rec["scheduled"].items() if rid in LONG) for rec in got) > CAP


@pytest.mark.parametrize("which", ["vllm", "vllm_gaudi"])
def test_async_scheduler_holds_share_with_switch(vllm_env, monkeypatch, which):
    env = {"VLLM_LONG_PREFILL_SHARE": SHARE, "VLLM_LONG_PREFILL_SHARE_ASYNC": "1"}
    scheduler = make_scheduler(vllm_env, monkeypatch, env=env, async_scheduling=True,
                               cls=async_scheduler_cls(which))
    trace, finished = drive(scheduler, stress_arrivals())
    assert set(LONG) <= finished
    assert assert_share_held(trace) >= sum(LONG.values()) // CAP
    for rid in ("dec2", "dec3"):
        assert first_step(trace, rid) == 5, f"{rid} waited behind the long prompts"


BAD = [
    ({"VLLM_LONG_PREFILL_SHARE": "half"}, THRESHOLD, "VLLM_LONG_PREFILL_SHARE='half'"),
    ({"VLLM_LONG_PREFILL_SHARE": "0"}, THRESHOLD, "VLLM_LONG_PREFILL_SHARE='0'"),
    ({"VLLM_LONG_PREFILL_SHARE": "1.5"}, THRESHOLD, "VLLM_LONG_PREFILL_SHARE='1.5'"),
    ({"VLLM_LONG_PREFILL_SHARE": "nan"}, THRESHOLD, "VLLM_LONG_PREFILL_SHARE='nan'"),
    ({"VLLM_LONG_PREFILL_SHARE": "-0.2"}, THRESHOLD, "VLLM_LONG_PREFILL_SHARE='-0.2'"),
    ({"VLLM_LONG_PREFILL_SHARE": SHARE, "VLLM_LONG_PREFILL_MIN_TOKENS": "32k"}, THRESHOLD,
     "VLLM_LONG_PREFILL_MIN_TOKENS='32k'"),
    ({"VLLM_LONG_PREFILL_SHARE": SHARE, "VLLM_LONG_PREFILL_MIN_TOKENS": "0"}, THRESHOLD,
     "VLLM_LONG_PREFILL_MIN_TOKENS='0'"),
    ({"VLLM_LONG_PREFILL_SHARE": SHARE, "VLLM_LONG_PREFILL_SHARE_ASYNC": "yes"}, THRESHOLD,
     "VLLM_LONG_PREFILL_SHARE_ASYNC='yes'"),
    ({"VLLM_LONG_PREFILL_SHARE": SHARE}, 0, "--long-prefill-token-threshold"),
]


@pytest.mark.parametrize("env,threshold,named", BAD, ids=[b[2].split("=")[0] + f"-{i}" for i, b in enumerate(BAD)])
def test_bad_values_are_refused_by_name(vllm_env, monkeypatch, env, threshold, named):
    try:
        make_scheduler(vllm_env, monkeypatch, env=env, threshold=threshold)
        error = None
    except ValueError as exc:
        error = str(exc)
    assert error is not None, f"{env} with threshold {threshold} was accepted"
    assert named in error, error
