"""Video files in multimodal samples: the frames a Qwen2.5-Omni sample uses, sampled as MindSpeed-MM's
Qwen2OmniPlugin._regularize_videos does (Ascend/MindSpeed-MM, mindspeed_mm/data/data_utils/func_utils/mm_plugin.py
at 57069cd55a8ab16d5affe379a2e2c5f0a4d962b9): `floor(duration x video_fps)` frames (at most `video_maxlen` and the
stream's frame count) spread evenly over the stream (numpy linspace, truncated), an odd count padded with the last
frame, and the video's own rate `sampled / duration` (2.0 when the stream reports no duration), which gives
second_per_grid = temporal_patch_size / rate. Decoded through PyAV (data/video/readers.py's decoder); a file that
will not decode is one VideoDataError line.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from PIL import Image

from mmrun.data.video.readers import VideoDataError, video_stream

DEFAULT_FPS = 2.0  # MindSpeed-MM's video_fps default, used as the rate of a stream without a duration


def sample_indices(total_frames: int, seconds: float | None, video_fps: float, video_maxlen: int) -> np.ndarray:
    """MindSpeed-MM's _get_video_sample_indices: which frames of the stream are kept."""
    if total_frames == 0:  # a stream that does not report its length
        return np.linspace(0, video_maxlen - 1, video_maxlen).astype(np.int32)
    wanted = max(1, math.floor((seconds or 0.0) * video_fps))
    return np.linspace(0, total_frames - 1, min(total_frames, video_maxlen, wanted)).astype(np.int32)


def read_video_file(path: str | os.PathLike, video_fps: float = DEFAULT_FPS, video_maxlen: int = 128,
                    what: str = "video") -> tuple[list[Image.Image], float]:
    """(the sampled frames as RGB images, the video's sampled rate in frames per second)."""
    path = Path(path)
    if not path.is_file():
        raise VideoDataError(f"{what} file {path} does not exist; fix the path")
    with video_stream(path, f"{what} file {path}") as (container, stream):
        seconds = float(stream.duration * stream.time_base) if stream.duration is not None else None
        keep = set(int(i) for i in sample_indices(stream.frames, seconds, video_fps, video_maxlen))
        frames = [frame.to_image() for index, frame in enumerate(container.decode(stream)) if index in keep]
    if not frames:
        raise VideoDataError(f"{what} file {path} will not decode (no frame in its video stream); replace the file")
    rate = DEFAULT_FPS if not seconds else len(keep) / seconds
    if len(frames) % 2:
        frames.append(frames[-1])
    return frames, rate
