"""TEMPORARY: a private numpy M-RoPE index, used only until `mmrun.data.multimodal.rope_index` lands.

The data pipeline owns `get_rope_index` (mmrun/data/multimodal/rope_index.py, same signature as below);
the model imports it from there and falls back to this copy while it does not exist yet. Delete this file
when the data module is on main. The rule is transformers 4.x's / MindSpeed-MM's `get_rope_index`
(text runs count up by one; a vision block gets (t, h, w) grid positions offset by the text before it,
the next text starts after the block's largest position; Qwen2.5-VL videos scale t by
second_per_grid_t * tokens_per_second). For images it equals transformers 5.x's rule; for videos whose
temporal grid exceeds the spatial one 5.x advances less after the block.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def get_rope_index(input_ids: np.ndarray, image_grid_thw: np.ndarray | None = None,
                   video_grid_thw: np.ndarray | None = None, attention_mask: np.ndarray | None = None, *,
                   spatial_merge_size: int, image_token_id: int, video_token_id: int, vision_start_token_id: int,
                   second_per_grid_ts: Any = None, tokens_per_second: float | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids int64 (3, B, S), rope_deltas int64 (B, 1)); padding (attention_mask 0) gets position 1."""
    ids = np.asarray(input_ids, dtype=np.int64)
    batch, seq = ids.shape
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask).astype(np.int64)
    positions = np.ones((3, batch, seq), dtype=np.int64)
    deltas = np.zeros((batch, 1), dtype=np.int64)
    images = iter([] if image_grid_thw is None else np.asarray(image_grid_thw).reshape(-1, 3).tolist())
    videos = iter([] if video_grid_thw is None else np.asarray(video_grid_thw).reshape(-1, 3).tolist())
    seconds = iter([] if second_per_grid_ts is None else np.asarray(second_per_grid_ts, np.float64).reshape(-1).tolist())
    for b in range(batch):
        row = ids[b][mask[b] == 1]
        pieces: list[np.ndarray] = []
        start = 0

        def next_start() -> int:
            return int(pieces[-1].max()) + 1 if pieces else 0

        while True:
            vision = np.nonzero((row[start:] == image_token_id) | (row[start:] == video_token_id))[0]
            if vision.size == 0:
                break
            at = start + int(vision[0])
            is_video = row[at] == video_token_id
            t, h, w = next(videos) if is_video else next(images)
            scale = 1.0
            if tokens_per_second is not None:
                scale = (next(seconds, 1.0) * tokens_per_second) if is_video else 0.0
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            offset = next_start()
            pieces.append(np.broadcast_to(np.arange(at - start) + offset, (3, at - start)))
            offset += at - start
            t_index = (np.arange(t) * scale).astype(np.int64) if tokens_per_second is not None else np.arange(t)
            grid = np.stack([np.repeat(t_index, gh * gw), np.tile(np.repeat(np.arange(gh), gw), t),
                             np.tile(np.arange(gw), t * gh)])
            pieces.append(grid + offset)
            start = at + t * gh * gw
        if start < row.size:
            pieces.append(np.broadcast_to(np.arange(row.size - start) + next_start(), (3, row.size - start)))
        flat = np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)
        positions[:, b, mask[b] == 1] = flat
        deltas[b, 0] = (int(flat.max()) + 1 if flat.size else 0) - row.size
    return positions, deltas
