"""Images for GLM-5.3-Flash in vLLM 0.26.0: the processor the model registers with
``MULTIMODAL_REGISTRY`` (processing info, dummy inputs for profiling, the prompt update).

* **Pixels and grids** come from the checkpoint's own HF processor (``Glm5NextProcessor`` /
  ``Glm5NextImageProcessor``, loaded from the files saved beside the weights), so vLLM feeds the
  tower exactly what transformers feeds it.
* **The chat template's placeholder** ``<|begin_of_image|><|image|><|end_of_image|>`` keeps its
  markers; ``<|image|>`` becomes ``grid_t * grid_h * grid_w / merge**2`` copies of the image
  token, where the tower's merged embeddings go (the same count the HF processor expands to).
* **GLM5_NEXT_IMAGE_MAX_TOKENS is enforced by resizing to fit**, as the checkpoint's processor
  does with its own ``max_image_tokens``: the processor is called with ``max_image_tokens =
  min(checkpoint's, switch)``, whatever the request's ``mm_processor_kwargs`` ask for, and every
  processed image is checked against the cap and the tower's patch geometry (a 400 naming what
  does not fit, instead of a shape error in the engine).
* **No video**: the model serves none, so a video item is refused (HTTP 400 through the server)
  with a message that says so. With GLM5_NEXT_VISION=0 no tower is built and images are refused
  the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

import torch
from transformers import BatchFeature
from vllm.config.multimodal import BaseDummyOptions
from vllm.exceptions import VLLMValidationError
from vllm.inputs import MultiModalDataDict
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import ImageSize, MultiModalDataItems
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
    PromptUpdate,
)

from ..switches import read_switches

#: the only modality served
IMAGE = "image"
#: what the port's chat template puts where an image part was (the processor expands <|image|>)
IMAGE_PLACEHOLDER = "<|begin_of_image|><|image|><|end_of_image|>"


class ImageInputError(ValueError):
    """An image the tower cannot take as processed (HTTP 400 through the server)."""


#: processor settings that fix the patch geometry the tower was built for (config.json)
GEOMETRY = {
    "patch_size": "patch_size",
    "temporal_patch_size": "temporal_patch_size",
    "merge_size": "spatial_merge_size",
}


def check_geometry_kwargs(mm_kwargs: Mapping[str, Any], vision_config) -> None:
    """Refuse processor kwargs (a request's mm_processor_kwargs) that would cut patches the tower
    was not built for: they would reach the engine as tensors of the wrong shape."""
    for key, field in GEOMETRY.items():
        if key in mm_kwargs and int(mm_kwargs[key]) != int(getattr(vision_config, field)):
            raise ImageInputError(
                f"mm_processor_kwargs {key}={mm_kwargs[key]!r}: the vision tower takes {field} "
                f"{getattr(vision_config, field)} (config.json)"
            )
    if int(mm_kwargs.get("patch_expand_factor", 1)) != 1:
        raise ImageInputError(
            f"mm_processor_kwargs patch_expand_factor={mm_kwargs['patch_expand_factor']!r}: only 1 is served"
        )


def check_processed_images(pixel_values: torch.Tensor, grids, vision_config, cap: int) -> None:
    """What the processor returned against what the tower takes and the cap allows."""
    vc = vision_config
    width = int(vc.in_channels) * int(vc.temporal_patch_size) * int(vc.patch_size) ** 2
    if pixel_values.shape[-1] != width:
        raise ImageInputError(
            f"the image processor's patches have {pixel_values.shape[-1]} values, the vision tower takes "
            f"{width} (in_channels * temporal_patch_size * patch_size**2 of config.json)"
        )
    merge = int(vc.spatial_merge_size)
    for i, grid in enumerate(grids):
        t, h, w = (int(x) for x in grid)
        if h % merge or w % merge:
            raise ImageInputError(
                f"image {i}: a grid of {h} x {w} patches does not divide into {merge} x {merge} merge windows"
            )
        n = image_tokens(grid, merge)
        if n > cap:
            raise ImageInputError(
                f"image {i} would add {n} tokens, above the cap of {cap} (GLM5_NEXT_IMAGE_MAX_TOKENS, "
                "or the checkpoint processor's max_image_tokens if lower); it was not resized to fit"
            )


def image_tokens(grid_thw, merge: int) -> int:
    """Tokens one image adds: its patches over the merge window (t * h * w / merge**2)."""
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (merge * merge)


def near_square_grid(tokens: int) -> tuple[int, int]:
    """(rows, cols) of merged tokens with rows * cols == tokens, as square as possible."""
    rows = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    return rows, tokens // rows


class Glm5NextProcessingInfo(BaseProcessingInfo):
    @cached_property
    def switches(self):
        """The GLM5_NEXT_* switches as this process started with them (read once)."""
        return read_switches()

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        # Video is left out: vLLM then treats it as unsupported (validate_num_items below).
        # GLM5_NEXT_VISION=0: no tower, so vLLM neither profiles nor accepts images.
        return {IMAGE: None if self.switches.vision else 0}

    def validate_num_items(self, modality: str, num_items: int) -> None:
        if modality != IMAGE:
            raise VLLMValidationError(
                f"GLM-5.3-Flash (glm5_next_hpu) serves text and images only; {modality} input is not supported",
                parameter=modality,
            )
        if num_items > 0 and not self.switches.vision:
            raise VLLMValidationError(
                "GLM5_NEXT_VISION=0: this server built no vision tower and accepts no images", parameter=modality
            )
        super().validate_num_items(modality, num_items)

    # --- the HF processor and the cap
    def get_image_processor(self, **kwargs: object):
        return self.get_hf_processor(**kwargs).image_processor

    @property
    def merge_size(self) -> int:
        return int(self.get_hf_config().vision_config.spatial_merge_size)

    def image_max_tokens(self) -> int:
        """min(the checkpoint processor's max_image_tokens, GLM5_NEXT_IMAGE_MAX_TOKENS)."""
        checkpoint = getattr(self.get_image_processor(), "max_image_tokens", None)
        switch = self.switches.image_max_tokens
        return switch if checkpoint is None else min(int(checkpoint), switch)

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        return {IMAGE: self.image_max_tokens()} if mm_counts.get(IMAGE, 0) else {}

    def get_image_size_with_most_features(self) -> ImageSize:
        """An image whose aligned canvas is exactly the cap: (rows x cols) merged tokens of
        patch * merge pixels each, so the processor neither scales it nor pads it."""
        vc = self.get_hf_config().vision_config
        side = int(vc.patch_size) * self.merge_size
        rows, cols = near_square_grid(self.image_max_tokens())
        return ImageSize(width=cols * side, height=rows * side)


class Glm5NextDummyInputsBuilder(BaseDummyInputsBuilder[Glm5NextProcessingInfo]):
    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return IMAGE_PLACEHOLDER * mm_counts.get(IMAGE, 0)

    def get_dummy_mm_data(
        self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Mapping[str, BaseDummyOptions]
    ) -> MultiModalDataDict:
        size = self.info.get_image_size_with_most_features()
        return {
            IMAGE: self._get_dummy_images(
                width=size.width,
                height=size.height,
                num_images=mm_counts.get(IMAGE, 0),
                overrides=mm_options.get(IMAGE),
            )
        }


class Glm5NextMultiModalProcessor(BaseMultiModalProcessor[Glm5NextProcessingInfo]):
    def _call_hf_processor(
        self,
        prompt: str,
        mm_data: Mapping[str, object],
        mm_kwargs: Mapping[str, Any],
        tok_kwargs: Mapping[str, object],
    ) -> BatchFeature:
        if not mm_data:
            ids = self.info.get_tokenizer().encode(prompt, add_special_tokens=False)
            return BatchFeature(dict(input_ids=[ids]), tensor_type="pt")
        vision_config = self.info.get_hf_config().vision_config
        check_geometry_kwargs(mm_kwargs, vision_config)
        cap = self.info.image_max_tokens()
        kwargs = dict(mm_kwargs)
        # A request may lower the cap (mm_processor_kwargs), never raise it.
        kwargs["max_image_tokens"] = min(int(kwargs.get("max_image_tokens", cap)), cap)
        out = super()._call_hf_processor(prompt, mm_data, kwargs, tok_kwargs)
        out.pop("mm_token_type_ids", None)  # images only: every image token is type 1
        if "pixel_values" in out:
            check_processed_images(out["pixel_values"], out["image_grid_thw"], vision_config, cap)
        return out

    def _get_mm_fields_config(
        self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object]
    ) -> Mapping[str, MultiModalFieldConfig]:
        grid = hf_inputs.get("image_grid_thw", torch.empty((0, 3)))
        return dict(
            pixel_values=MultiModalFieldConfig.flat_from_sizes(IMAGE, grid.prod(-1)),
            image_grid_thw=MultiModalFieldConfig.batched(IMAGE, keep_on_cpu=True),
        )

    def _get_prompt_updates(
        self,
        mm_items: MultiModalDataItems,
        hf_processor_mm_kwargs: Mapping[str, Any],
        out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        image_token_id = int(self.info.get_hf_config().image_token_id)
        merge = self.info.merge_size

        def replacement(item_idx: int) -> list[int]:
            grid = out_mm_kwargs[IMAGE][item_idx]["image_grid_thw"].data
            return [image_token_id] * image_tokens(grid, merge)

        return [PromptReplacement(modality=IMAGE, target=[image_token_id], replacement=replacement)]


class Glm5NextImageModelMixin(SupportsMultiModal):
    """The model side of images: the tower and merger on the pixels, one embedding tensor per
    image in prompt order. vLLM merges them at the placeholder positions through
    ``SupportsMultiModal.embed_input_ids`` -> ``utils._merge_multimodal_embeddings`` (the merge
    path the fix pack's mm-merge-idxcopy patches on HPU); the model does not override it.

    Expects ``self.model.language_model`` (with ``embed_input_ids``) and, when vision is
    built, ``self.model.visual`` (``glm5_next_hpu.layers.vision.VisionModel``)."""

    # SupportsMultiModal's (declared, not defined: the model is an nn.Module first, whose
    # __getattr__ would otherwise be what a type checker sees)
    embed_input_ids: Callable[..., torch.Tensor]

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        if modality.startswith(IMAGE):
            return IMAGE_PLACEHOLDER
        raise ValueError(
            f"GLM-5.3-Flash (glm5_next_hpu) serves text and images only; {modality} input is not supported"
        )

    def get_language_model(self) -> torch.nn.Module:
        return self.model.language_model

    def embed_multimodal(self, **kwargs: Any) -> list[torch.Tensor]:
        pixels = kwargs.pop("pixel_values", None)
        grid = kwargs.pop("image_grid_thw", None)
        if pixels is None:
            return []
        visual = getattr(self.model, "visual", None)
        if visual is None:  # the processor refuses images first; this guards other entry points
            raise ValueError("GLM5_NEXT_VISION=0: no vision tower was built, images cannot be embedded")
        if isinstance(pixels, (list, tuple)):
            pixels = torch.cat([p.reshape(-1, p.shape[-1]) for p in pixels])
        if isinstance(grid, (list, tuple)):
            grid = torch.stack([torch.as_tensor(g).reshape(3) for g in grid])
        grid = torch.as_tensor(grid).reshape(-1, 3).cpu()
        weight = visual.patch_embed.proj.weight
        embeds = visual(pixels.to(device=weight.device, dtype=weight.dtype), grid)
        return list(embeds.split([image_tokens(g, visual.merge) for g in grid.tolist()]))
