"""vLLM 0.26.0 integration of the GLM-5.3-Flash port (imported lazily by vLLM's ModelRegistry).

``loader``    checkpoint key -> exactly one parameter, byte-counted completeness
``model``     Glm5NextForConditionalGeneration for vLLM (KDA as a MambaBase layer, MLA per platform)
"""
