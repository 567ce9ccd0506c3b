"""Quick manual probe: build the checkpoint and run vllm.LLM once (prints what happens)."""
import os, sys, tempfile, time
from pathlib import Path
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
import checkpoint as ck
d = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
t0 = time.time()
ref, cfg = ck.build(d)
print("checkpoint", d, time.time() - t0, flush=True)
from vllm import LLM, SamplingParams, TokensPrompt
llm = LLM(model=str(d), tokenizer=str(d), dtype="float32", enforce_eager=True, enable_prefix_caching=False,
          max_model_len=256, max_num_seqs=4, mamba_ssm_cache_dtype="float32", seed=0)
print("engine up", time.time() - t0, flush=True)
ps = ck.prompt_ids(3)
out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
import torch
for p, o in zip(ps, out):
    got = list(o.outputs[0].token_ids)
    with torch.no_grad():
        r = ref.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)[0, len(p):].tolist()
    print(got, r, got == r, flush=True)
