"""Write frames as one video file: MP4 (H.264 through PyAV) where PyAV is installed, else an animated GIF
(Pillow). Either way through the atomic writer: a reader never sees half a video.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from mmrun.common.atomic_write import AtomicFile
from mmrun.data.video.readers import VideoDataError

MP4_CODEC = "libx264"


def mp4_available() -> bool:
    try:
        import av  # noqa: F401, PLC0415 - only asks whether the optional decoder is installed
    except ImportError:
        return False
    return True


def _even(frames: np.ndarray) -> np.ndarray:
    """yuv420p halves the chroma planes: odd sides get their last row/column repeated."""
    pad = [(0, 0), (0, frames.shape[1] % 2), (0, frames.shape[2] % 2), (0, 0)]
    return np.pad(frames, pad, mode="edge") if any(p[1] for p in pad) else frames


def _write_mp4(path: Path, frames: np.ndarray, fps: float) -> None:
    import av  # noqa: PLC0415 - optional encoder
    from fractions import Fraction  # noqa: PLC0415

    frames = _even(frames)
    with AtomicFile(path, "wb") as file:
        with av.open(file, mode="w", format="mp4") as container:
            stream = container.add_stream(MP4_CODEC, rate=Fraction(fps).limit_denominator(1000))
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": "18"}  # tiny demo clips: keep colours close to the model's output
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())


def _write_gif(path: Path, frames: np.ndarray, fps: float) -> None:
    images = [Image.fromarray(frame) for frame in frames]
    with AtomicFile(path, "wb") as file:
        images[0].save(file, format="GIF", save_all=True, append_images=images[1:],
                       duration=max(1, round(1000 / fps)), loop=0)


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: float) -> Path:
    """Write uint8 (T, H, W, 3) frames to `path`; returns the file written.

    A `.mp4` path becomes a `.gif` beside it when PyAV is missing (the returned path says which).
    """
    path = Path(path)
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise VideoDataError(f"{path}: a video is uint8 frames (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if fps <= 0:
        raise VideoDataError(f"{path}: fps must be positive, got {fps}")
    if path.suffix.lower() == ".gif":
        _write_gif(path, frames, fps)
    elif mp4_available():
        _write_mp4(path, frames, fps)
    else:
        path = path.with_suffix(".gif")
        _write_gif(path, frames, fps)
    return path


def to_uint8_frames(video: np.ndarray) -> np.ndarray:
    """A decoded (C, T, H, W) clip in [-1, 1] -> uint8 (T, H, W, 3), as diffusers' video processor rounds."""
    video = np.clip((np.asarray(video, dtype=np.float32) + 1.0) / 2.0, 0.0, 1.0)
    return np.rint(video.transpose(1, 2, 3, 0) * 255.0).astype(np.uint8)
