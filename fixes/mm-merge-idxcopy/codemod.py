"""Merge image embeddings of non-M-RoPE models with index_copy_ at positions the runner
builds on the host, instead of masked_scatter_ on the device bool mask."""

from fixpack.codemod import Rewrite, replace_once


class RunnerAttachesHostIndex(Rewrite):
    target = "vllm_gaudi/v1/worker/hpu_model_runner.py"
    nodes = ["HPUModelRunner._gather_mm_embeddings"]

    def rewrite(self, qualname, node):
        return replace_once(
            node, "    else:\n"
            "        is_mm_embed = self.is_mm_embed.copy_to_gpu(total_num_scheduled_tokens)\n",
            "    else:\n"
            "        # Placeholder positions for an index_copy_ merge, built on the host:\n"
            "        # merging with the bool mask is a masked_scatter_ (a dynamic nonzero\n"
            "        # on HPU). The model still gets the bool mask for its own uses of it.\n"
            "        mm_index = torch.nonzero(is_mm_embed[:total_num_scheduled_tokens], as_tuple=True)[0]\n"
            "        is_mm_embed = self.is_mm_embed.copy_to_gpu(total_num_scheduled_tokens)\n"
            "        is_mm_embed.hpu_mm_index = mm_index.to(self.device)\n")


class MergeUsesHostIndex(Rewrite):
    target = "vllm_gaudi/models/utils.py"
    nodes = ["_merge_multimodal_embeddings"]

    def rewrite(self, qualname, node):
        node = replace_once(
            node, "    input_dtype = inputs_embeds.dtype\n",
            "    input_dtype = inputs_embeds.dtype\n"
            "\n"
            "    # The runner's own mask carries the host-built positions of its True\n"
            "    # entries (HPUModelRunner._gather_mm_embeddings); merge with them.\n"
            "    # Masks a model derives itself are new tensors and merge as before.\n"
            "    mm_index = getattr(is_multimodal, \"hpu_mm_index\", None)\n"
            "    if mm_index is not None:\n"
            "        if len(mm_index) != len(mm_embeds_flat):\n"
            "            expr = _embedding_count_expression(multimodal_embeddings)\n"
            "            raise ValueError(f\"Attempted to assign {expr} = {len(mm_embeds_flat)} \"\n"
            "                             f\"multimodal tokens to {len(mm_index)} placeholders\")\n"
            "        is_multimodal = mm_index\n")
        return replace_once(node, "        return inputs_embeds.index_copy_(0, is_multimodal, mm_embeds_flat)\n",
                     "        return inputs_embeds.index_copy_(0, is_multimodal, mm_embeds_flat.to(dtype=input_dtype))\n")
