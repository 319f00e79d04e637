"""Qwen2-VL image and video pixels: resize, rescale, normalise, cut into flattened patches (numpy + Pillow).

The numbers equal transformers' PIL processor (`Qwen2VLImageProcessorPil`, the slow processor MindSpeed-MM
used with transformers 4.x): `smart_resize` picks a size divisible by patch_size * merge_size, Pillow
resizes with bicubic, pixels are scaled by 1/255 in float64 and cast to float32, normalised in float32 with
CLIP's mean/std, and cut into `patch_size` squares listed in 2x2-merge order, each patch flattened as
(channel, time, row, column) = 3 * 2 * 14 * 14 = 1176 values. A still image is its own second frame.

Before that, MindSpeed-MM's `Qwen2VLPlugin` regularises every image (`regularize_image`): a nearest-neighbour
resize into [image_min_pixels, image_max_pixels], RGB, a short side under 28 stretched to 28, an aspect ratio
over 200 clamped to 180:1. The dataset does both steps; `preprocess_images` alone is the processor.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np
from PIL import Image

from mmrun.data.gpt_dataset import DatasetConfigError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# transformers refuses images thinner than this; MindSpeed-MM clamps them to CLAMPED_ASPECT first.
MAX_ASPECT_RATIO = 200
CLAMPED_ASPECT = 180
# The ViT needs at least one merged 2x2 block of 14 px patches along each side.
MIN_SIDE = 28
PREPROCESSOR_CONFIG = "preprocessor_config.json"
# transformers' video processor reads its own file first and falls back to the image processor's.
VIDEO_PREPROCESSOR_CONFIG = "video_preprocessor_config.json"


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """(height, width) divisible by `factor`, area within [min_pixels, max_pixels], aspect kept (transformers' rule).

    Python's round() rounds half to even, as transformers does: 70 px / 28 = 2.5 -> 2 -> 56 px.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
                         f"got {max(height, width) / min(height, width)} for {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The processor's settings; names and defaults are transformers' `Qwen2VLImageProcessor`'s."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = int(Image.Resampling.BICUBIC)
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    @property
    def patch_dim(self) -> int:
        """Values per flattened patch: 3 * 2 * 14 * 14 = 1176."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @classmethod
    def from_dict(cls, raw: dict, source: str = PREPROCESSOR_CONFIG) -> "ImageProcessorConfig":
        """Both spellings of the pixel limits: `min_pixels`/`max_pixels` (transformers 4.x, the hub's Qwen2-VL
        files) and `size: {shortest_edge, longest_edge}` (transformers 5); explicit keys win, as in transformers."""
        values: dict[str, Any] = {}
        size = raw.get("size")
        if isinstance(size, dict):
            for key, name in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels"),
                              ("min_pixels", "min_pixels"), ("max_pixels", "max_pixels")):
                if size.get(key) is not None:
                    values[name] = size[key]
        elif size is not None:
            raise DatasetConfigError(f"{source}: 'size' must be a dict with shortest_edge/longest_edge. "
                                     f"Received: {type(size).__name__} {size!r}.")
        known = {f.name: f for f in fields(cls)}
        values.update({k: v for k, v in raw.items() if k in known and v is not None})
        for name, value in values.items():
            default = getattr(cls, name)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:  # mean / std
                ok = isinstance(value, (list, tuple)) and len(value) == 3 and all(
                    isinstance(x, (int, float)) for x in value)
            if not ok:
                raise DatasetConfigError(f"{source}: {name!r} has the wrong type. Received: {type(value).__name__} "
                                         f"{value!r}; expected {type(default).__name__}.")
            if isinstance(default, tuple):
                values[name] = tuple(float(x) for x in value)
        config = cls(**values)
        if config.min_pixels > config.max_pixels:
            raise DatasetConfigError(f"{source}: min_pixels {config.min_pixels} is above max_pixels "
                                     f"{config.max_pixels}; lower min_pixels.")
        return config

    @classmethod
    def from_pretrained(cls, directory: str, video: bool = False) -> "ImageProcessorConfig":
        """Read `preprocessor_config.json` (or, for `video=True`, `video_preprocessor_config.json` when there is one)."""
        names = (VIDEO_PREPROCESSOR_CONFIG, PREPROCESSOR_CONFIG) if video else (PREPROCESSOR_CONFIG,)
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8") as f:
                        raw = json.load(f)
                except (OSError, ValueError) as exc:
                    raise DatasetConfigError(f"{path}: cannot read it as JSON ({exc}); fix or replace the file.") from None
                if not isinstance(raw, dict):
                    raise DatasetConfigError(f"{path}: expected a JSON object. Received: {type(raw).__name__}.")
                return cls.from_dict(raw, source=path)
        raise DatasetConfigError(f"{os.path.join(directory, PREPROCESSOR_CONFIG)} not found; model_name_or_path must "
                                 "be a Hugging Face model directory with the image processor's settings.")


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB as transformers' processor makes it: transparency is composited onto white, other modes converted."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def regularize_image(image: Image.Image, max_pixels: int, min_pixels: int) -> Image.Image:
    """MindSpeed-MM's `Qwen2VLPlugin._preprocess_image`, before the processor (see the module docstring)."""
    for bad, target in ((image.width * image.height > max_pixels, max_pixels),
                        (image.width * image.height < min_pixels, min_pixels)):
        if bad:
            factor = math.sqrt(target / (image.width * image.height))
            image = image.resize((int(image.width * factor), int(image.height * factor)),
                                 resample=Image.Resampling.NEAREST)
    if image.mode != "RGB":
        image = image.convert("RGB")  # MindSpeed-MM drops alpha here (no white background)
    if min(image.width, image.height) < MIN_SIDE:
        image = image.resize((max(image.width, MIN_SIDE), max(image.height, MIN_SIDE)), resample=Image.Resampling.BICUBIC)
    if image.width / image.height > MAX_ASPECT_RATIO:
        image = image.resize((image.height * CLAMPED_ASPECT, image.height), resample=Image.Resampling.BICUBIC)
    if image.height / image.width > MAX_ASPECT_RATIO:
        image = image.resize((image.width, image.width * CLAMPED_ASPECT), resample=Image.Resampling.BICUBIC)
    return image


def _value_table(config: ImageProcessorConfig) -> np.ndarray:
    """[3, 256] float32: the processor's value for each channel and 8-bit level.

    Rescale (float64 multiply, cast to float32) and normalise (float32) are applied to the 256 levels with
    the same operations transformers applies to each pixel, so looking pixels up is bit-identical and fast.
    """
    levels = np.arange(256, dtype=np.uint8)
    values = np.broadcast_to(levels, (3, 256))
    if config.do_rescale:
        values = (values.astype(np.float64) * config.rescale_factor).astype(np.float32)
    else:
        values = values.astype(np.float32)
    if config.do_normalize:
        mean = np.asarray(config.image_mean, dtype=np.float32)[:, None]
        std = np.asarray(config.image_std, dtype=np.float32)[:, None]
        values = (values - mean) / std
    return np.ascontiguousarray(values, dtype=np.float32)


def _resized_frames(frames: Sequence[Image.Image], config: ImageProcessorConfig) -> np.ndarray:
    """[T, H, W, 3] uint8: the frames in RGB, resized to the processor's size (all frames must share one size)."""
    size = frames[0].size
    if any(frame.size != size for frame in frames):
        raise ValueError(f"all frames of a video must have one size; got {sorted({f.size for f in frames})}")
    width, height = size
    factor = config.patch_size * config.merge_size
    if config.do_resize:
        height, width = smart_resize(height, width, factor, config.min_pixels, config.max_pixels)
    out = []
    for frame in frames:
        frame = to_rgb(frame) if config.do_convert_rgb else frame
        if config.do_resize:
            frame = frame.resize((width, height), resample=config.resample)
        out.append(np.asarray(frame, dtype=np.uint8))
    if out[0].ndim != 3 or out[0].shape[2] != 3:
        raise ValueError(f"expected RGB pixels; got an array of shape {out[0].shape} (set do_convert_rgb)")
    if height % factor or width % factor:
        raise ValueError(f"a {height}x{width} image is not divisible into {factor} px merged patches; enable do_resize")
    return np.stack(out)


def _patchify(pixels: np.ndarray, config: ImageProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[T, H, W, 3] float32 -> ([t*h*w, 3*tp*p*p], (t, h, w)) in transformers' 2x2-merge order."""
    p, m, tp = config.patch_size, config.merge_size, config.temporal_patch_size
    frames, height, width, channels = pixels.shape
    if frames % tp:  # repeat the last frame up to a whole temporal patch, as transformers does
        pixels = np.concatenate([pixels, np.repeat(pixels[-1:], tp - frames % tp, axis=0)])
        frames = pixels.shape[0]
    gt, gh, gw = frames // tp, height // p, width // p
    patches = pixels.reshape(gt, tp, gh // m, m, p, gw // m, m, p, channels)
    # (t, merged row, merged column, row in block, column in block, channel, frame, pixel row, pixel column)
    patches = patches.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return patches.reshape(gt * gh * gw, channels * tp * p * p), (gt, gh, gw)


def _process(frames: Sequence[Image.Image], config: ImageProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    levels = _resized_frames(frames, config)
    table = _value_table(config)
    pixels = table[np.arange(3), levels]  # [T, H, W, 3] float32 by lookup
    return _patchify(pixels, config)


def preprocess_images(images: Sequence[Image.Image], config: ImageProcessorConfig) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values float32 [N, 1176], image_grid_thw int64 [n, 3]) as `Qwen2VLImageProcessorPil`."""
    if not images:
        return np.zeros((0, config.patch_dim), np.float32), np.zeros((0, 3), np.int64)
    patches, grids = [], []
    for image in images:
        # one image = one temporal patch: the frame repeated temporal_patch_size times
        flat, grid = _process([image] * config.temporal_patch_size, config)
        patches.append(flat)
        grids.append(grid)
    return np.concatenate(patches), np.asarray(grids, dtype=np.int64)


def preprocess_video(frames: Sequence[Image.Image], config: ImageProcessorConfig) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values_videos float32 [N, 1176], video_grid_thw int64 [1, 3]) for one video given as its frames;
    an odd frame count repeats the last frame, as transformers' video processor does."""
    if not frames:
        raise ValueError("a video needs at least one frame")
    flat, grid = _process(list(frames), config)
    return flat, np.asarray([grid], dtype=np.int64)
