"""Bound the exponential decode block buckets of dense models by the allocated KV cache
(non-contiguous PA), and keep the full range for models whose block references can reach
the worst case (hybrid, GDN/mamba, interleaved sliding window, inflated KV block)."""

from fixpack.codemod import Rewrite, replace_once

OLD_SIG = "def get_decode_cfgs(self, max_num_seqs, block_size, max_num_batched_tokens, max_model_len, max_blocks):"
NEW_SIG = ("def get_decode_cfgs(self, max_num_seqs, block_size, max_num_batched_tokens, max_model_len, max_blocks,\n"
           "                    skip_decode_block_clamp=False):")


class ManagerFlag(Rewrite):
    target = "vllm_gaudi/extension/bucketing/common.py"
    nodes = ["HPUBucketingManager.initialize", "HPUBucketingManager.generate_decode_buckets"]

    def rewrite(self, qualname, node):
        if qualname.endswith("initialize"):
            return replace_once(
                node, "    self.num_hpu_blocks = None\n",
                "    self.num_hpu_blocks = None\n"
                "    # Set by the model runner (warmup_model) for models whose decode block\n"
                "    # references can reach the worst case; they skip the decode block clamp.\n"
                "    self.skip_decode_block_clamp = False\n")
        return replace_once(
            node, "                max_blocks=self.num_hpu_blocks)\n",
            "                max_blocks=self.num_hpu_blocks,\n"
            "                skip_decode_block_clamp=getattr(self, 'skip_decode_block_clamp', False))\n")


class ExponentialClamp(Rewrite):
    target = "vllm_gaudi/extension/bucketing/exponential.py"
    nodes = ["ExponentialBucketingStrategy.get_decode_cfgs"]

    def rewrite(self, qualname, node):
        node2 = replace_once(node, OLD_SIG, NEW_SIG)
        return replace_once(
            node2,
            "    max_decode_blocks = min(max_blocks, max_decode_blocks) if use_contiguous_pa else max_decode_blocks\n",
            "    if use_contiguous_pa:\n"
            "        max_decode_blocks = min(max_blocks, max_decode_blocks)\n"
            "    elif not skip_decode_block_clamp:\n"
            "        # Non-contiguous PA buckets count block references (sum of the\n"
            "        # sequences' block tables). The worst case above (every sequence at\n"
            "        # max_model_len) can be many times the allocated cache, and warming\n"
            "        # that bucket runs out of memory at the first decode warmup. Shared\n"
            "        # prefix blocks are counted once per sequence, so keep 3x headroom\n"
            "        # over the physical blocks instead of the physical count itself.\n"
            "        max_decode_blocks = min(max_decode_blocks, max_blocks * 3)\n")


class LinearSignature(Rewrite):
    target = "vllm_gaudi/extension/bucketing/linear.py"
    nodes = ["LinearBucketingStrategy.get_decode_cfgs"]

    def rewrite(self, qualname, node):
        return replace_once(node, OLD_SIG, NEW_SIG)


class PaddingAwareSignature(Rewrite):
    target = "vllm_gaudi/extension/bucketing/padding_aware.py"
    nodes = ["PaddingAwareBucketingStrategy.get_decode_cfgs"]

    def rewrite(self, qualname, node):
        return replace_once(node, OLD_SIG, NEW_SIG)


class RunnerDetectsUnboundedModels(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    nodes = ["HPUModelRunner.warmup_model"]

    def rewrite(self, qualname, node):
        return replace_once(
            node, "        saved_block_size = self.bucketing_manager.block_size\n",
            "        saved_block_size = self.bucketing_manager.block_size\n"
            "        # Decode block references can reach the unclamped worst case for an\n"
            "        # inflated KV block (attn != KV block size), GDN/mamba-like hybrids\n"
            "        # and interleaved sliding-window models (full-context global layers):\n"
            "        # clamping them would make runtime batches miss the warmed buckets.\n"
            "        self.bucketing_manager.skip_decode_block_clamp = (self.attn_block_size != self.block_size\n"
            "                                                          or self.num_gdn > 0\n"
            "                                                          or self.num_mamba_like_layers > 0\n"
            "                                                          or self.interleaved_sliding_window)\n")
