"""Decode a video into uint8 frames (T, H, W, 3): MP4 and other containers through PyAV, GIF and folders of
still frames through Pillow.

PyAV (the `video` extra, which bundles FFmpeg) is imported only when a container file is read, so the data
floor stays numpy + Pillow. Every failure is one `VideoDataError` line that names the file.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from PIL import Image, ImageSequence, UnidentifiedImageError

from mmrun.data.gpt_dataset import DatasetConfigError

# Pillow decodes these as animations; everything else that is a file goes to PyAV.
PILLOW_ANIMATIONS = (".gif", ".webp", ".apng")
FRAME_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
# MindSpeed-MM's video processor falls back to 30 fps when a reader reports none (folders of frames).
DEFAULT_FPS = 30.0
VIDEO_EXTRA = "pip install 'mmrun[video]' (PyAV)"


class VideoDataError(DatasetConfigError):
    """A video, annotation or preprocessing setting that cannot be used (one line, names the file)."""


@dataclass
class Video:
    frames: np.ndarray  # uint8 (T, H, W, 3)
    fps: float
    path: str


def import_av():
    """PyAV, or one line that says which extra installs it."""
    try:
        import av  # noqa: PLC0415 - optional decoder, loaded only when a container is read or written
    except ImportError as error:
        raise VideoDataError(f"reading or writing MP4 needs PyAV, which is not installed ({error}): "
                             f"{VIDEO_EXTRA}") from None
    return av


def _read_frame_folder(path: Path) -> Video:
    names = sorted(p for p in path.iterdir() if p.suffix.lower() in FRAME_EXTENSIONS)
    if not names:
        raise VideoDataError(f"{path}: a folder of frames holds no image file ({', '.join(FRAME_EXTENSIONS)})")
    frames = []
    for name in names:
        try:
            with Image.open(name) as image:
                frames.append(np.asarray(image.convert("RGB")))
        except (OSError, UnidentifiedImageError) as error:
            raise VideoDataError(f"{name}: frame will not decode ({error})") from None
    if len({f.shape for f in frames}) != 1:
        raise VideoDataError(f"{path}: its frames differ in size ({sorted({f.shape[:2] for f in frames})})")
    return Video(np.stack(frames), DEFAULT_FPS, str(path))


def _read_with_pillow(path: Path) -> Video:
    try:
        with Image.open(path) as image:
            frames, durations = [], []
            for frame in ImageSequence.Iterator(image):
                frames.append(np.asarray(frame.convert("RGB")))
                durations.append(frame.info.get("duration") or 0)
    except (OSError, UnidentifiedImageError, ValueError) as error:
        raise VideoDataError(f"{path}: video will not decode ({error})") from None
    base = min((d for d in durations if d > 0), default=0)
    if not base:
        return Video(np.stack(frames), DEFAULT_FPS, str(path))
    # GIF writers (Pillow among them) merge identical consecutive frames into one longer frame: undo that.
    repeats = [max(1, round(d / base)) for d in durations]
    return Video(np.repeat(np.stack(frames), repeats, axis=0), 1000.0 / base, str(path))


@contextmanager
def video_stream(path: Path, label: str) -> Iterator[tuple[Any, Any]]:
    """(container, its first video stream) through PyAV; a missing stream or a decoder failure inside the block is
    one VideoDataError line starting with `label` (the file, in the caller's words)."""
    av = import_av()
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoDataError(f"{label} has no video stream; give a video file")
            yield container, container.streams.video[0]
    except VideoDataError:
        raise
    except (av.FFmpegError, ValueError, OSError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise VideoDataError(f"{label} will not decode ({detail}); replace the file") from None


def _read_with_av(path: Path) -> Video:
    with video_stream(path, f"{path}: video") as (container, stream):
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        rate = stream.average_rate or stream.guessed_rate
    if not frames:
        raise VideoDataError(f"{path}: video will not decode (no frame in its video stream); replace the file")
    return Video(np.stack(frames), float(rate) if rate else DEFAULT_FPS, str(path))


def read_video(path: str | os.PathLike) -> Video:
    """All frames of `path` (a video file, a GIF, or a folder of still frames in name order), uint8 RGB."""
    path = Path(path)
    if path.is_dir():
        return _read_frame_folder(path)
    if not path.is_file():
        raise VideoDataError(f"{path}: no such video file or folder of frames")
    if path.suffix.lower() in PILLOW_ANIMATIONS:
        return _read_with_pillow(path)
    return _read_with_av(path)
