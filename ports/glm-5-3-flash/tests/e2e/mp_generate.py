"""Run vLLM with the multiprocess engine (engine core in its own process, which must find the
plugin through the vllm.general_plugins entry point by itself); print greedy tokens as JSON.

usage: python mp_generate.py CHECKPOINT_DIR NEW_TOKENS PROMPT_IDS_JSON
"""

import json
import os
import sys

if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams, TokensPrompt

    path, n, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    llm = LLM(
        model=path,
        tokenizer=path,
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=256,
        max_num_seqs=4,
        mamba_ssm_cache_dtype="float32",
        seed=0,
    )
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
        use_tqdm=False,
    )
    print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
