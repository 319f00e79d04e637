"""Qwen3-VL's part of generation (the loop, the cache and the token choice are models/vlm/generation.py's).

The prompt runs once: the ViT's merged features replace its visual tokens and DeepStack's features are added
to those same rows after the first decoder layers, as in training. Its interleaved M-RoPE positions give
`rope_delta`, and each new token (text, so no DeepStack row) takes position index + rope_delta in all three
rows, as transformers' Qwen3VLModel does after the prompt.
"""
from __future__ import annotations

from typing import Any

from mmrun.backend import tensors
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.generation import Decoding, KVCache, Prompt, device_array
from mmrun.models.qwen3_vl.modeling import rope_index


class Qwen3VLDecoding(Decoding):
    """Qwen3-VL's decoder (`model.language_model`) and DeepStack on the prompt."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.text = model.model.language_model

    def prompt_hidden(self, prompt: Prompt, cache: KVCache | None) -> tuple[Any, int]:
        if prompt.second_per_grid_ts is not None:
            raise ValueError("second_per_grid_ts is Qwen2.5-VL's; Qwen3-VL's prompt separates video frames by "
                             "timestamp text instead")
        ids = tensors.from_numpy(prompt.input_ids)
        image_grid, video_grid = (vision_layout.grid_array(prompt.image_grid_thw),
                                  vision_layout.grid_array(prompt.video_grid_thw))
        embeds, deepstack = self.model.embed(ids, device_array(prompt.pixel_values), image_grid,
                                             device_array(prompt.pixel_values_videos), video_grid)
        positions, deltas = rope_index(self.model.config, prompt.input_ids, image_grid, video_grid)
        return self.text(embeds, tensors.from_numpy(positions), deepstack, cache=cache), int(deltas[0, 0])
