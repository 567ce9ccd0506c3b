"""The model's layers, shared by the parity model (``reference.py``) and the vLLM model.

``norm``       RMSNorm
``moe``        the clamped SwiGLU MLP, the router, the routed experts, the MoE block
``kda_layer``  the KDA (linear attention) layer of the parity model
``mla``        NoPE multi-head latent attention and the DSA indexer
``mhc``        the decoder layer's hyper-connection parameters
``vision``     the vision tower

Module and parameter names are the checkpoint's keys (``model.language_model.*``,
``model.visual.*``), so ``weights.py`` only handles the tensors stored differently.
"""
