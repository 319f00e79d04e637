"""Qwen2-VL / Qwen2.5-VL's part of generation: what the loop of models/vlm/generation.py asks of the model
(its text decoder, the prompt's embeddings and M-RoPE positions)."""
from __future__ import annotations

from typing import Any

from mmrun.backend import tensors
from mmrun.models.qwen2_vl.modeling import rope_index
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.blocks import merge_vision
from mmrun.models.vlm.generation import Decoding, KVCache, Prompt, device_array


class Qwen2VLDecoding(Decoding):
    """Qwen2-VL / Qwen2.5-VL: the decoder is `model.model`; M-RoPE positions from the prompt's grids."""

    def prompt_hidden(self, prompt: Prompt, cache: KVCache | None) -> tuple[Any, int]:
        """The prompt through the decoder once (filling `cache`): (hidden (1, S, H), rope_delta)."""
        model = self.model
        ids = tensors.from_numpy(prompt.input_ids)
        image_grid, video_grid = (vision_layout.grid_array(prompt.image_grid_thw),
                                  vision_layout.grid_array(prompt.video_grid_thw))
        embeds = merge_vision(model.config, model.visual, False, ids, self.text.embed_tokens(ids),
                              device_array(prompt.pixel_values), image_grid, device_array(prompt.pixel_values_videos),
                              video_grid)
        positions, deltas = rope_index(model.config, prompt.input_ids, image_grid, video_grid, None,
                                       prompt.second_per_grid_ts)
        return self.text(embeds, tensors.from_numpy(positions), cache=cache), int(deltas[0, 0])
