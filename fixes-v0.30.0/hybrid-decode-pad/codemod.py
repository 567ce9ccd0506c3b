"""hybrid-decode-pad: on a hybrid model whose KV block is split into several attention kernel
blocks, the decode pad block and the decode block-bucket limit are counted in kernel blocks,
the unit of the attention caches and of the decode block tables."""

from fixpack.codemod import Rewrite, replace_once


class PadBlockInKernelBlocks(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    nodes = ["HPUModelRunner.initialize_kv_cache"]

    def rewrite(self, qualname, node):
        new = replace_once(
            node,
            """        kv_caches: dict[str, torch.Tensor] = {}
        num_blocks = 0
""",
            """        kv_caches: dict[str, torch.Tensor] = {}
        num_blocks = 0
        # Attention kernel blocks allocated on the hybrid path (None elsewhere).
        num_attn_kernel_blocks = None
""", indent=4)
        new = replace_once(
            new,
            """                        num_kernel_blocks = num_blocks * blocks_per_kv_block
""",
            """                        num_kernel_blocks = num_blocks * blocks_per_kv_block
                        num_attn_kernel_blocks = num_kernel_blocks
""", indent=4)
        new = replace_once(
            new,
            """        self._PAD_BLOCK_ID = num_blocks
        self._PAD_SLOT_ID = num_blocks * self.attn_block_size
""",
            """        # Hybrid attention caches hold num_blocks * blocks_per_kv_block + 1 kernel blocks and the
        # decode block tables hold kernel block ids: the pad block is that extra last kernel block.
        # num_blocks (KV blocks) would be the first kernel block of a live KV block, which padded
        # decode rows would then overwrite.
        self._num_attn_kernel_blocks = num_blocks if num_attn_kernel_blocks is None else num_attn_kernel_blocks
        self._PAD_BLOCK_ID = self._num_attn_kernel_blocks
        self._PAD_SLOT_ID = self._num_attn_kernel_blocks * self.attn_block_size
""", indent=4)
        # Keep the blank lines above the method as they were (re-parsing indents them).
        return new


class DecodeBucketLimitInKernelBlocks(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    nodes = ["HPUModelRunner.warmup_model"]

    def rewrite(self, qualname, node):
        new = replace_once(
            node,
            """            if self.attn_block_size != self.block_size:
                self.bucketing_manager.block_size = self.attn_block_size
            try:
                self.bucketing_manager.generate_decode_buckets()
            finally:
                self.bucketing_manager.block_size = saved_block_size
""",
            """            if self.attn_block_size != self.block_size:
                self.bucketing_manager.block_size = self.attn_block_size
            # Decode block counts are attention kernel blocks; so is their limit (num_hpu_blocks
            # counts KV blocks, several kernel blocks each on a hybrid model).
            saved_num_hpu_blocks = self.bucketing_manager.num_hpu_blocks
            self.bucketing_manager.num_hpu_blocks = getattr(self, "_num_attn_kernel_blocks", saved_num_hpu_blocks)
            try:
                self.bucketing_manager.generate_decode_buckets()
            finally:
                self.bucketing_manager.block_size = saved_block_size
                self.bucketing_manager.num_hpu_blocks = saved_num_hpu_blocks
""", indent=4)
        return new
