"""Multimodal RoPE (M-RoPE) position ids for Qwen2-VL and Qwen2.5-VL, in numpy.

Three rows (time, height, width). Text tokens get the running index in all three rows. The tokens of an
image or video (a run of `<|image_pad|>` / `<|video_pad|>`) get a grid: time = frame index (Qwen2.5-VL:
frame index * second_per_grid_t * tokens_per_second, truncated), height/width = the merged patch's row and
column, all offset by the position where the run starts; the text after it continues at
start + max(grid_h, grid_w) / merge_size. Padding (attention_mask 0) is skipped and keeps position 0.

This is transformers 5.x's `Qwen2VLModel.get_rope_index` / `Qwen2_5_VLModel.get_rope_index` (tests check
equality). Two places where MindSpeed-MM's copy (from transformers 4.x) differs and this follows 5.x:
padding there gets position 1, not 0 (no effect on training: padding is on the right, masked from the loss
and never attended to by earlier tokens); and after a video whose temporal extent exceeds its spatial one,
4.x continues the text at the grid's maximum + 1.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

TEXT, IMAGE, VIDEO = 0, 1, 2


@dataclass(frozen=True)
class RopeConfig:
    """What `get_rope_index` needs from the model: merge size, the vision token ids, Qwen2.5-VL's time scale."""

    spatial_merge_size: int
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    tokens_per_second: float | None = None  # None: Qwen2-VL's rule (frame index)
    # Qwen3-VL: each video frame (temporal patch) is its own vision block after its timestamp text, so the rule
    # runs over one (1, h, w) grid per frame (per_frame_grids)
    frames_split: bool = False

    def kwargs(self) -> dict:
        return {"spatial_merge_size": self.spatial_merge_size, "image_token_id": self.image_token_id,
                "video_token_id": self.video_token_id, "vision_start_token_id": self.vision_start_token_id,
                "tokens_per_second": self.tokens_per_second}

    @classmethod
    def from_model_config(cls, config: dict) -> "RopeConfig":
        """From a Hugging Face Qwen2-VL / Qwen2.5-VL `config.json` dict (tokens_per_second only for qwen2_5_vl)."""
        vision = config.get("vision_config") or {}
        qwen25 = config.get("model_type") == "qwen2_5_vl"
        return cls(spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
                   image_token_id=int(config["image_token_id"]), video_token_id=int(config["video_token_id"]),
                   vision_start_token_id=int(config["vision_start_token_id"]),
                   tokens_per_second=vision.get("tokens_per_second", 4) if qwen25 else None,
                   frames_split=config.get("model_type") == "qwen3_vl")

    def video_grids(self, video_grid_thw: np.ndarray | None) -> np.ndarray | None:
        """The video grids as get_rope_index reads them for this model (per_frame_grids for Qwen3-VL)."""
        return per_frame_grids(video_grid_thw) if self.frames_split else video_grid_thw

    @classmethod
    def from_pretrained(cls, directory: str) -> "RopeConfig":
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            return cls.from_model_config(json.load(f))


def per_frame_grids(video_grid_thw: np.ndarray | None) -> np.ndarray | None:
    """(t, h, w) rows -> t rows of (1, h, w): Qwen3-VL's videos, whose frames are separate vision blocks."""
    if video_grid_thw is None:
        return None
    grids = np.repeat(np.asarray(video_grid_thw), np.asarray(video_grid_thw)[:, 0], axis=0)
    grids[:, 0] = 1
    return grids


def _runs(types: np.ndarray) -> list[tuple[int, int, int]]:
    """(type, start, end) of each stretch of equal token types."""
    if types.size == 0:
        return []
    edges = np.flatnonzero(np.diff(types)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [types.size]])
    return [(int(types[s]), int(s), int(e)) for s, e in zip(starts, ends)]


def token_types(input_ids: np.ndarray, image_token_id: int, video_token_id: int) -> np.ndarray:
    """0 text, 1 image, 2 video per token: transformers 5.x's `mm_token_type_ids` (its processor returns them;
    its Qwen2-VL forward refuses images without them), same shape as `input_ids`."""
    ids = np.asarray(input_ids)
    return np.where(ids == image_token_id, IMAGE, np.where(ids == video_token_id, VIDEO, TEXT)).astype(ids.dtype)


def _vision_positions(start: int, grid: np.ndarray, merge: int, time_interval) -> np.ndarray:
    t, h, w = int(grid[0]), int(grid[1]) // merge, int(grid[2]) // merge
    if time_interval is None:
        times = np.arange(t, dtype=np.int64)
    else:  # float32 product, truncated toward zero: what torch computes for `(arange(t) * interval).long()`
        times = (np.arange(t, dtype=np.float32) * np.float32(time_interval)).astype(np.int64)
    tt, hh, ww = np.meshgrid(times, np.arange(h, dtype=np.int64) + start, np.arange(w, dtype=np.int64) + start,
                             indexing="ij")
    positions = np.stack([tt, hh, ww]).reshape(3, -1)
    positions[0] += start
    return positions


def get_rope_index(
    input_ids: np.ndarray,
    image_grid_thw: np.ndarray | None = None,
    video_grid_thw: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
    *,
    spatial_merge_size: int,
    image_token_id: int,
    video_token_id: int,
    vision_start_token_id: int,
    second_per_grid_ts: np.ndarray | None = None,
    tokens_per_second: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids int64 [3, B, S], rope_deltas int64 [B, 1]); see the module docstring.

    Grids are consumed in order over the whole batch (row 0's images first). `tokens_per_second=None` is
    Qwen2-VL's rule; a number is Qwen2.5-VL's (video time scaled by `second_per_grid_ts[i] * tokens_per_second`,
    1 second per grid when `second_per_grid_ts` is None). A vision run that is not preceded by
    `vision_start_token_id`, or whose length is not its grid's t*h*w / merge**2, is an error (truncated or
    misassembled input), as is a grid count that does not match the runs.
    """
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    mask = np.ones_like(input_ids, dtype=bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    grids: dict[int, Iterator] = {
        IMAGE: iter(np.asarray(image_grid_thw).reshape(-1, 3)) if image_grid_thw is not None else iter(()),
        VIDEO: iter(np.asarray(video_grid_thw).reshape(-1, 3)) if video_grid_thw is not None else iter(()),
    }
    seconds = iter(np.asarray(second_per_grid_ts, dtype=np.float32).reshape(-1)) if second_per_grid_ts is not None \
        else None
    names = {IMAGE: "image", VIDEO: "video"}
    position_ids = np.zeros((3, batch, length), dtype=np.int64)
    deltas = np.zeros((batch, 1), dtype=np.int64)
    for row in range(batch):
        ids = input_ids[row][mask[row]]
        types = token_types(ids, image_token_id, video_token_id)
        pieces, position = [], 0
        for kind, start, end in _runs(types):
            if kind == TEXT:
                pieces.append(np.broadcast_to(np.arange(end - start, dtype=np.int64) + position, (3, end - start)))
                position += end - start
                continue
            grid = next(grids[kind], None)
            if grid is None:
                raise ValueError(f"row {row} has more {names[kind]} token runs than {names[kind]}_grid_thw has rows")
            expected = int(np.prod(grid)) // spatial_merge_size ** 2
            if end - start != expected or start == 0 or ids[start - 1] != vision_start_token_id:
                raise ValueError(
                    f"row {row}: a run of {end - start} {names[kind]} tokens at position {start} does not match its "
                    f"grid {grid.tolist()} ({expected} tokens after <|vision_start|>); the sequence was cut or "
                    "assembled wrongly")
            interval = None
            if tokens_per_second is not None:
                second = np.float32(1.0) if seconds is None or kind == IMAGE else next(seconds, None)
                if second is None:
                    raise ValueError(f"row {row}: second_per_grid_ts has fewer entries than there are videos")
                interval = None if kind == IMAGE else np.float32(tokens_per_second) * np.float32(second)
            pieces.append(_vision_positions(position, grid, spatial_merge_size, interval))
            position += max(int(grid[1]), int(grid[2])) // spatial_merge_size
        if not pieces:
            continue
        positions = np.concatenate(pieces, axis=1)
        position_ids[:, row, mask[row]] = positions
        deltas[row, 0] = positions.max() + 1 - ids.size
    return position_ids, deltas
