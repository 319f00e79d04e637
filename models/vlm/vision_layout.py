"""Host-side bookkeeping of the Qwen2-VL ViT, computed with numpy from `grid_thw` once per forward.

`grid_thw` rows are (t, h, w) in patches per image or video: t temporal patches (frames / 2), h x w
spatial patches. The processor emits each image's patches in 2x2-merge order (the four patches of one
merged token are consecutive), so every table here follows that order. Nothing here touches a
framework: the model turns the results into device tensors (positions, gather indices) or passes them
as boundaries to `ops.varlen_attention`.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def grid_array(grid_thw: Any) -> np.ndarray | None:
    """`grid_thw` (a tensor of either framework, an array or nested lists; None stays None) as int64
    numpy (n, 3). A device tensor is copied to the host here, once."""
    if grid_thw is None:
        return None
    if hasattr(grid_thw, "asnumpy"):  # MindSpore
        grid_thw = grid_thw.asnumpy()
    elif hasattr(grid_thw, "detach"):  # torch
        grid_thw = grid_thw.detach().cpu().numpy()
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    if grid.size and grid.min() < 1:
        raise ValueError(f"grid_thw has a zero or negative size {grid.tolist()}; each row is (t, h, w) in patches")
    return grid


def patch_counts(grid: np.ndarray) -> np.ndarray:
    """Patches per image / video: t * h * w."""
    return grid.prod(axis=1)


def rotary_position_ids(grid: np.ndarray, merge: int) -> np.ndarray:
    """(patches, 2) int64: each patch's (row, column) in its frame, listed in 2x2-merge order, repeated per frame."""
    rows = []
    for t, h, w in grid.tolist():
        if h % merge or w % merge:
            raise ValueError(f"grid (t={t}, h={h}, w={w}) is not divisible by spatial_merge_size {merge}; "
                             "the image processor must resize to multiples of patch_size * merge_size")
        hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (h // merge, merge, w // merge, merge)
        hpos = hpos.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
        wpos = wpos.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
        rows.append(np.tile(np.stack([hpos, wpos], axis=-1), (t, 1)))
    return np.concatenate(rows, axis=0) if rows else np.zeros((0, 2), np.int64)


def frame_cu_seqlens(grid: np.ndarray) -> np.ndarray:
    """Boundaries of the attention segments: one per frame (h * w patches each), t per image / video."""
    lengths = np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def window_index(grid: np.ndarray, merge: int, window_size: int, patch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's window attention layout: (order, cu_window_seqlens).

    `order` (merged tokens,) lists the merged tokens window by window (each frame of each image cut into
    windows of window_size pixels, row-major, the last row/column of windows partial); the ViT gathers its
    merged-token groups in this order, attends within each window (`cu_window_seqlens`, in patches), and
    the merger's output is put back with argsort(order). transformers' get_vision_window_index."""
    tokens_per_window = window_size // merge // patch_size  # merged tokens along one side of a window
    unit = merge * merge
    order, bounds, offset = [], [0], 0
    for t, h, w in grid.tolist():
        gh, gw = h // merge, w // merge
        index = np.arange(t * gh * gw).reshape(t, gh, gw)
        wins_h, wins_w = -(-gh // tokens_per_window), -(-gw // tokens_per_window)
        for frame in range(t):
            for i in range(wins_h):
                for j in range(wins_w):
                    block = index[frame, i * tokens_per_window:(i + 1) * tokens_per_window,
                                  j * tokens_per_window:(j + 1) * tokens_per_window].reshape(-1)
                    order.append(block + offset)
                    bounds.append(bounds[-1] + block.size * unit)
        offset += t * gh * gw
    order_array = np.concatenate(order).astype(np.int64) if order else np.zeros(0, np.int64)
    return order_array, np.asarray(bounds, dtype=np.int64)


# Models whose batches the entry pads to fixed shapes for MindSpore's compiled step (fixed_layout below), on the
# data-parallel and the tensor/pipeline-parallel engine alike (Qwen2.5-VL's windows as segment ids, Qwen3-VL's
# position taps as inputs); Qwen3-VL MoE's split stage is not padded yet.
FIXED_SHAPE_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# ... on the data-parallel engine (an unsplit model): Qwen2.5-VL's windows as segment ids (window_segment_ids),
# Qwen3-VL's learned-position taps (models/qwen3_vl/modeling.py fixed_position_taps) as inputs of the step too.
DATA_PARALLEL_FIXED_SHAPE_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def pads_to_fixed_shapes(model_type: str, split: bool) -> bool:
    """Whether MindSpore's compiled step takes this model's batches padded to fixed shapes (split: over
    tensor/pipeline ranks on the parallel engine, else on the data-parallel engine)."""
    return model_type in (FIXED_SHAPE_MODELS if split else DATA_PARALLEL_FIXED_SHAPE_MODELS)


def patch_bucket(total: int, smallest: int = 64) -> int:
    """The padded patch count of a fixed-shape batch: `smallest` doubled until it holds total, so a run
    meets a few ViT shapes (each one compiled graph on MindSpore) instead of one per batch."""
    size = max(int(smallest), 1)
    while size < total:
        size *= 2
    return size


def fixed_layout(grid: np.ndarray | None, merge: int, patches: int) -> tuple[np.ndarray, np.ndarray]:
    """The ViT's per-patch layout for a batch padded to `patches` patches (the compiled MindSpore step):
    segment ids (patches,) int32, one per frame, the padding a segment of its own (so ops.segment_attention
    keeps it apart), and the rotary (row, column) positions (patches, 2) int64, 0 for the padding."""
    grid = np.zeros((0, 3), np.int64) if grid is None else grid
    bounds = frame_cu_seqlens(grid)
    total = int(bounds[-1])
    if total > patches or (patches - total) % (merge * merge):
        raise ValueError(f"{total} patches cannot be padded to {patches}: pad to at least the batch's patches, "
                         f"in whole {merge}x{merge} groups")
    segments = np.full(patches, len(bounds) - 1, dtype=np.int32)
    segments[:total] = np.repeat(np.arange(len(bounds) - 1, dtype=np.int32), np.diff(bounds))
    positions = np.zeros((patches, 2), dtype=np.int64)
    positions[:total] = rotary_position_ids(grid, merge)
    return segments, positions


def window_segment_ids(grid: np.ndarray | None, merge: int, window_size: int, patch_size: int,
                       patches: int) -> np.ndarray:
    """Qwen2.5-VL's windows for a batch padded to `patches` patches, in the patches' own order: (patches,) int32,
    each patch the id of its window (window_index's windows, numbered in its order), the padding one segment of
    its own. Attention within equal ids (ops.segment_attention) is window attention without regrouping the
    patches window by window: the same result as window_index's gather, attention and scatter back."""
    grid = np.zeros((0, 3), np.int64) if grid is None else grid
    order, bounds = window_index(grid, merge, window_size, patch_size)
    unit = merge * merge
    tokens = np.empty(order.size, dtype=np.int32)  # window of each merged token, in image order
    tokens[order] = np.repeat(np.arange(len(bounds) - 1, dtype=np.int32), np.diff(bounds) // unit)
    segments = np.full(patches, len(bounds) - 1, dtype=np.int32)
    segments[:order.size * unit] = np.repeat(tokens, unit)
    return segments
