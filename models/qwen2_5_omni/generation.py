"""Qwen2.5-Omni's thinker in the generation loop of models/qwen2_vl/generation.py (text out).

The prompt runs once: its audio, image and video features replace their pad tokens as in training, and its
TMRoPE positions give `rope_delta`; each new token (text) then takes position index + rope_delta in all three
rows, as transformers' thinker does after the prompt. A prompt carries the processor's audio inputs beside the
vision ones (OmniPrompt).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mmrun.backend import tensors
from mmrun.data.multimodal.omni_rope_index import get_rope_index
from mmrun.models.qwen2_vl.generation import Qwen2VLDecoding
from mmrun.models.vlm import vision_layout
from mmrun.models.vlm.blocks import merge_vision
from mmrun.models.vlm.generation import KVCache, Prompt, device_array


@dataclass
class OmniPrompt(Prompt):
    """A Prompt with the processor's audio inputs: input_features (audios, mel, T), feature_attention_mask
    (audios, T), and whether each video's sound track is interleaved with it."""

    input_features: np.ndarray | None = None
    feature_attention_mask: np.ndarray | None = None
    use_audio_in_video: bool = False


class OmniDecoding(Qwen2VLDecoding):
    """Qwen2VLDecoding with the thinker's audio merge and TMRoPE on the prompt."""

    def prompt_hidden(self, prompt: Prompt, cache: KVCache | None) -> tuple[Any, int]:
        model = self.model
        ids = tensors.from_numpy(prompt.input_ids)
        image_grid, video_grid = (vision_layout.grid_array(prompt.image_grid_thw),
                                  vision_layout.grid_array(prompt.video_grid_thw))
        embeds = merge_vision(model.vision_config, model.visual, False, ids, self.text.embed_tokens(ids),
                              device_array(prompt.pixel_values), image_grid, device_array(prompt.pixel_values_videos), video_grid)
        features, mask = getattr(prompt, "input_features", None), getattr(prompt, "feature_attention_mask", None)
        embeds = model.merge_audio(ids, embeds, device_array(features), mask)
        positions, deltas = get_rope_index(
            model.rope_config, prompt.input_ids, image_grid, video_grid, None,
            bool(getattr(prompt, "use_audio_in_video", False)), None if mask is None else np.asarray(mask).sum(axis=1),
            prompt.second_per_grid_ts)
        return self.text(embeds, tensors.from_numpy(positions), cache=cache), int(deltas[0, 0])
