"""Segment bookkeeping for variable-length (packed) attention, framework-neutral (numpy only).

A packed sequence holds several independent segments (the images and video frames of a ViT batch, the
windows of Qwen2.5-VL's window attention) back to back; `cu_seqlens` are their boundaries
[0, l0, l0+l1, ..., total], as flash-attention's varlen kernels take them. Both backends' `ops.varlen_attention`
use these helpers, so they agree on what a valid boundary list is and how segments are grouped.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def check_cu_seqlens(cu_seqlens: Sequence[int] | np.ndarray | Any, total: int) -> np.ndarray:
    """The boundaries as an int64 numpy array; one clear error unless they start at 0, never decrease and
    end at `total` (the packed length). A device tensor is accepted but costs a device-to-host copy."""
    if hasattr(cu_seqlens, "asnumpy"):  # a MindSpore tensor
        cu_seqlens = cu_seqlens.asnumpy()
    elif hasattr(cu_seqlens, "detach"):  # a torch tensor
        cu_seqlens = cu_seqlens.detach().cpu().numpy()
    bounds = np.asarray(cu_seqlens, dtype=np.int64).reshape(-1)
    if bounds.size < 1 or bounds[0] != 0 or bounds[-1] != total or np.any(np.diff(bounds) < 0):
        shown = bounds.tolist() if bounds.size <= 12 else f"{bounds[:6].tolist()} ... {bounds[-3:].tolist()}"
        raise ValueError(f"cu_seqlens {shown} do not split a packed sequence of {total} tokens; pass boundaries "
                         f"that start at 0, never decrease and end at {total}")
    return bounds


def equal_length_runs(bounds: np.ndarray) -> list[tuple[int, int]]:
    """(segment length, how many in a row) for each run of consecutive equal-length segments, empty
    segments dropped: every frame of a video, or the full windows of an image, become one batched call."""
    runs: list[tuple[int, int]] = []
    for length in np.diff(bounds).tolist():
        if length == 0:
            continue
        if runs and runs[-1][0] == length:
            runs[-1] = (length, runs[-1][1] + 1)
        else:
            runs.append((length, 1))
    return runs
