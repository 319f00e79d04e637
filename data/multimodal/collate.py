"""Samples -> one batch of numpy arrays, as MindSpeed-MM's `DataCollatorForQwen2vl`, plus M-RoPE positions.

Right padding (pad id, attention_mask 0, labels -100) to the longest sample rounded up to a multiple of
`pad_to_multiple_of` (MindSpeed-MM: 8), never beyond `max_length` (the dataset binds it to --seq-length;
samples are never longer). Pipeline parallelism needs one fixed length: pass
`pad_to_multiple_of=seq_length`. Pixels and grids are concatenated over the batch in sample order; a batch
without images has no image keys (MindSpeed-MM instead adds a fake white 64x64 image with zero weight so
that the ViT runs on every rank; the model decides whether it needs that). `position_ids` come from
`get_rope_index` here, so both frameworks receive the same ones.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mmrun.data.multimodal.omni_rope_index import OmniRopeConfig
from mmrun.data.multimodal.omni_rope_index import get_rope_index as get_omni_rope_index
from mmrun.data.multimodal.rope_index import RopeConfig, get_rope_index
from mmrun.data.multimodal.templates import IGNORE_INDEX

# Sample key -> batch key, concatenated along the first axis when some sample has it.
CONCATENATED = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def padded_length(longest: int, pad_to_multiple_of: int | None, max_length: int | None) -> int:
    """The batch's sequence length (see the module docstring)."""
    multiple = pad_to_multiple_of or 1
    length = -(-longest // multiple) * multiple
    if max_length is not None:
        if longest > max_length:
            raise ValueError(f"a sample of {longest} tokens is longer than max_length {max_length}")
        length = min(length, max_length)
    return length


def collate(samples: Sequence[dict], pad_token_id: int, rope_config: RopeConfig, *,
            pad_to_multiple_of: int | None = 8, max_length: int | None = None) -> dict[str, np.ndarray]:
    """A batch: input_ids, attention_mask, labels int64 [B, S]; position_ids int64 [3, B, S]; and, when present,
    pixel_values float32 [N, 1176], image_grid_thw int64 [n, 3], pixel_values_videos float32 [M, 1176],
    video_grid_thw int64 [v, 3], second_per_grid_ts float32 [v]."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    length = padded_length(max(len(s["input_ids"]) for s in samples), pad_to_multiple_of, max_length)
    batch = len(samples)
    input_ids = np.full((batch, length), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((batch, length), dtype=np.int64)
    labels = np.full((batch, length), IGNORE_INDEX, dtype=np.int64)
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        input_ids[row, :n] = sample["input_ids"]
        attention_mask[row, :n] = 1
        labels[row, :n] = sample["labels"]
    out = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    for key in CONCATENATED:
        parts = [s[key] for s in samples if key in s]
        if parts:
            out[key] = np.concatenate(parts)
    if any("input_features" in s for s in samples):  # Qwen2.5-Omni's audio: frames padded to the batch's longest
        out.update(_audio_batch(samples))
    if isinstance(rope_config, OmniRopeConfig):
        mask = out.get("feature_attention_mask")
        out["position_ids"], _ = get_omni_rope_index(
            rope_config, input_ids, out.get("image_grid_thw"), out.get("video_grid_thw"), attention_mask,
            rope_config.use_audio_in_video, None if mask is None else mask.sum(axis=1), out.get("second_per_grid_ts"))
        return out
    out["position_ids"], _ = get_rope_index(
        input_ids, out.get("image_grid_thw"), rope_config.video_grids(out.get("video_grid_thw")), attention_mask,
        second_per_grid_ts=out.get("second_per_grid_ts"), **rope_config.kwargs())
    return out


def _audio_batch(samples: Sequence[dict]) -> dict[str, np.ndarray]:
    """input_features (audios, mel, frames) and feature_attention_mask (audios, frames) of every sample's audios, in
    sample order, zero-padded to the longest audio of the batch."""
    parts = [s for s in samples if "input_features" in s]
    longest = max(s["input_features"].shape[-1] for s in parts)
    features = [np.pad(s["input_features"], ((0, 0), (0, 0), (0, longest - s["input_features"].shape[-1])))
                for s in parts]
    masks = [np.pad(s["feature_attention_mask"], ((0, 0), (0, longest - s["feature_attention_mask"].shape[-1])))
             for s in parts]
    return {"input_features": np.concatenate(features), "feature_attention_mask": np.concatenate(masks)}
