"""MindSpeed-MM's video preprocessing for Wan feature extraction, in numpy + Pillow.

`preprocess_parameters` of a MindSpeed-MM data.json (OpensoraplanVideoProcessor) pick the frames:
the stride is `frame_interval` (or fps / `train_fps` with `auto_interval`), `speed_factor` thins them, a clip
longer than `num_frames` is cut at a random start to `num_frames * frame_interval` indices (MindSpeed-MM's
TemporalRandomCrop, which counts sampled indices), and the count is cut down to the nearest 4k + 1 not under
`min_num_frames` so the VAE's temporal stride 4 needs no padding. Its `train_pipeline` lists then run in
order, as WanTextVideoDataset does: `video_and_first_frame` (ResizeVideo shortside, ToTensorVideo), the first
frame is kept, then `video_only` (CenterCropResizeVideo to max_height x max_width, norm_fun mean 0.5 std 0.5:
pixels in [-1, 1]). Clips are (T, C, H, W) while transformed, as there, and returned (C, T, H, W).

Resizing follows torch.nn.functional.interpolate (within 4e-6 on floats, 1 on uint8): bilinear and plain bicubic
(a = -0.75, edge taps repeated) in numpy with its source-index rules; antialiased downscaling with Pillow's filters,
which torch's antialias path reproduces.
One deliberate difference: a clip shorter than `num_frames` is refused (one line) where MindSpeed-MM would
shorten it silently when `drop_short_ratio` < 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np
from PIL import Image

from mmrun.data.video.readers import Video, VideoDataError

VAE_STRIDE_T = 4  # the Wan VAE maps 1 + 4k frames onto 1 + k latent frames


@dataclass
class PreprocessParameters:
    """The keys of MindSpeed-MM's `preprocess_parameters` that decide frames and pixels (defaults: its own)."""

    num_frames: int = 16
    min_num_frames: int = 29
    frame_interval: int = 1
    auto_interval: bool = True
    train_fps: float = 24
    speed_factor: float = 1.0
    max_height: int = 480
    max_width: int = 640
    max_hxw: int | None = None
    min_hxw: int | None = None
    hw_stride: int = 32
    train_pipeline: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PreprocessParameters":
        """From a data.json's preprocess_parameters; keys about readers, buckets and sampling ratios are not used."""
        known = {f.name for f in fields(cls)}
        params = cls(**{k: v for k, v in values.items() if k in known})
        if params.max_hxw is not None and params.min_hxw is None:
            params.min_hxw = params.max_hxw // 4
        if params.num_frames < 1 or params.max_height < 1 or params.max_width < 1:
            raise VideoDataError(f"preprocess_parameters: num_frames {params.num_frames}, max_height "
                                 f"{params.max_height} and max_width {params.max_width} must be positive")
        return params

    def transform_size(self, with_area: bool = True) -> dict[str, Any]:
        """What `"transform_size": "auto"` stands for (the first pipeline also gets the area bounds)."""
        size = {"max_height": self.max_height, "max_width": self.max_width}
        if with_area:
            size.update(max_hxw=self.max_hxw, min_hxw=self.min_hxw)
        return size


def closest_4k_plus_1(count: int, min_num_frames: int) -> int:
    """The largest y <= count with (y - 1) % 4 == 0 and y >= min_num_frames, or -1 (find_closest_y)."""
    for y in range(count, min_num_frames - 1, -1):
        if (y - 1) % VAE_STRIDE_T == 0:
            return y
    return -1


def sample_frame_indices(total_frames: int, fps: float, params: PreprocessParameters, rng: np.random.Generator,
                         path: str = "video") -> np.ndarray:
    """The frame indices MindSpeed-MM's OpensoraplanVideoProcessor takes from a clip of `total_frames`."""
    fps = fps if fps > 0 else 30.0
    if params.auto_interval:
        interval = 1.0 if abs(fps - params.train_fps) < 0.1 else fps / params.train_fps
    else:
        interval = params.frame_interval
    indices = np.arange(0, total_frames, interval).astype(int)
    indices = indices[indices < total_frames]
    max_speed_factor = len(indices) / params.num_frames
    if params.speed_factor > 1 and max_speed_factor > 1:
        target = int(len(indices) / min(params.speed_factor, max_speed_factor))
        indices = indices[np.linspace(0, len(indices) - 1, target, dtype=int)]
    if len(indices) > params.num_frames:
        size = int(params.num_frames * interval)
        begin = int(rng.integers(0, max(0, len(indices) - size - 1) + 1))
        indices = indices[begin:min(begin + size, len(indices))]
    if len(indices) < params.num_frames:
        raise VideoDataError(f"{path}: {total_frames} frames give {len(indices)} at frame interval {interval:g}, "
                             f"fewer than num_frames {params.num_frames}: use a longer clip or lower num_frames")
    end = closest_4k_plus_1(len(indices), params.min_num_frames)
    if end == -1:
        raise VideoDataError(f"{path}: {len(indices)} sampled frames hold no 4k+1 count >= min_num_frames "
                             f"{params.min_num_frames}")
    return indices[:end]


# --- resizing as torch.nn.functional.interpolate does -------------------------------------------------------

def _source_weights(size_in: int, size_out: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps (i0, i1, lambda) per output index with interpolate's source-index rule."""
    dst = np.arange(size_out, dtype=np.float64)
    if align_corners:
        src = dst * ((size_in - 1) / (size_out - 1)) if size_out > 1 else np.zeros_like(dst)
    else:
        src = np.maximum((dst + 0.5) * (size_in / size_out) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(int), size_in - 1)
    i1 = np.minimum(i0 + 1, size_in - 1)
    return i0, i1, (src - i0).astype(np.float32)


def _bilinear(clip: np.ndarray, height: int, width: int, align_corners: bool) -> np.ndarray:
    data = clip.astype(np.float32)
    i0, i1, lam = _source_weights(data.shape[-2], height, align_corners)
    data = data[..., i0, :] * (1 - lam)[:, None] + data[..., i1, :] * lam[:, None]
    j0, j1, lam = _source_weights(data.shape[-1], width, align_corners)
    return data[..., j0] * (1 - lam) + data[..., j1] * lam


CUBIC_A = -0.75  # torch's plain (not antialiased) bicubic: Keys' cubic convolution with a = -0.75 (Pillow: -0.5)


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """The four cubic-convolution weights (n, 4) of the taps at floor(src) - 1 .. floor(src) + 2, t = src - floor."""
    a = CUBIC_A
    d = np.stack([t + 1, t, 1 - t, 2 - t], axis=-1)  # each tap's distance from the source point
    near = ((a + 2) * d - (a + 3)) * d * d + 1  # |d| <= 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # 1 < |d| < 2
    return np.where(d <= 1, near, far)


def _bicubic_axis(data: np.ndarray, size_out: int, axis: int, align_corners: bool) -> np.ndarray:
    """One axis of interpolate(mode="bicubic", antialias=False): its source-index rule without the clamp at 0
    that bilinear has (cubic=True), taps outside the image take the edge pixel."""
    size_in = data.shape[axis]
    dst = np.arange(size_out, dtype=np.float64)
    if align_corners:
        src = dst * ((size_in - 1) / (size_out - 1)) if size_out > 1 else np.zeros_like(dst)
    else:
        src = (dst + 0.5) * (size_in / size_out) - 0.5
    base = np.floor(src)
    weights = _cubic_weights(src - base).astype(np.float32)
    taps = np.clip(base.astype(int)[:, None] + np.arange(-1, 3), 0, size_in - 1)
    moved = np.moveaxis(data, axis, -1)
    out = (moved[..., taps] * weights).sum(axis=-1)
    return np.moveaxis(out, -1, axis)


def _bicubic(clip: np.ndarray, height: int, width: int, align_corners: bool) -> np.ndarray:
    data = _bicubic_axis(clip.astype(np.float32), height, -2, align_corners)
    return _bicubic_axis(data, width, -1, align_corners)


PILLOW_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def _pillow(clip: np.ndarray, height: int, width: int, mode: str) -> np.ndarray:
    planes = clip.astype(np.float32).reshape(-1, *clip.shape[-2:])
    out = np.stack([np.asarray(Image.fromarray(p, mode="F").resize((width, height), PILLOW_FILTERS[mode]))
                    for p in planes])
    return out.reshape(*clip.shape[:-2], height, width)


def resize(clip: np.ndarray, size: tuple[int, int], mode: str = "bilinear", align_corners: bool = False,
           antialias: bool = False) -> np.ndarray:
    """(..., H, W) -> (..., h, w); uint8 stays uint8 (rounded), as interpolate on uint8 does."""
    height, width = size
    if mode not in PILLOW_FILTERS:
        raise VideoDataError(f"interpolation_mode {mode!r}: mmrun resizes with {sorted(PILLOW_FILTERS)}")
    downscale = height < clip.shape[-2] or width < clip.shape[-1]
    if mode == "bilinear" and not (antialias and downscale):
        out = _bilinear(clip, height, width, align_corners)
    elif mode == "bicubic" and not antialias:
        if clip.dtype == np.uint8:  # torch's uint8 kernel is another algorithm (it differs from its float one)
            raise VideoDataError("resize bicubic with antialias=False on uint8 frames: mmrun follows torch's float "
                                 "kernel; put ToTensorVideo before this step (MindSpeed-MM's jsons do)")
        out = _bicubic(clip, height, width, align_corners)
    elif not align_corners:  # antialiased: torch's antialias path is Pillow's filters (bicubic a = -0.5)
        out = _pillow(clip, height, width, mode)
    else:
        raise VideoDataError(f"resize {mode} with align_corners=True, antialias=True: torch's interpolate refuses "
                             "it too; set align_corners false or antialias false")
    if clip.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out.astype(np.float32)


def shortside_size(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
    """MindSpeed-MM's shortsideresize: the size that covers target, aspect kept."""
    if height / width < target[0] / target[1]:
        return target[0], int(target[0] / height * width)
    return int(target[1] / width * height), target[1]


def longside_size(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
    """MindSpeed-MM's longsideresize: the size that fits inside target, aspect kept."""
    if height / width > target[0] / target[1]:
        return target[0], int(target[0] / height * width)
    return int(target[1] / width * height), target[1]


def maxhw_size(height: int, width: int, max_hxw: int) -> tuple[int, int]:
    if height * width <= max_hxw:
        return height, width
    scale = np.sqrt(max_hxw / (height * width))
    return int(height * scale), int(width * scale)


RESIZE_MODES: dict[str, Callable[[int, int, Any], tuple[int, int]]] = {
    "resize": lambda h, w, size: size,
    "shortside": shortside_size,
    "longside": longside_size,
    "hxw": maxhw_size,
}


def _size_of(transform_size: Any, mode: str) -> Any:
    if mode == "hxw":
        return transform_size["max_hxw"] if isinstance(transform_size, dict) else transform_size
    if isinstance(transform_size, dict):
        return transform_size["max_height"], transform_size["max_width"]
    return tuple(transform_size)


def resize_video(clip: np.ndarray, transform_size: Any, mode: str = "resize", interpolation_mode: str = "bilinear",
                 align_corners: bool = False, antialias: bool = False, skip_low_resolution: bool = False
                 ) -> np.ndarray:
    """MindSpeed-MM's ResizeVideo."""
    if mode not in RESIZE_MODES:
        raise VideoDataError(f"ResizeVideo mode {mode!r}: choose one of {sorted(RESIZE_MODES)}")
    height, width = clip.shape[-2:]
    size = _size_of(transform_size, mode)
    if skip_low_resolution and mode in ("shortside", "longside") and height <= size[0] and width <= size[1]:
        return clip
    target = RESIZE_MODES[mode](height, width, size)
    if tuple(target) == (height, width):
        return clip
    return resize(clip, target, interpolation_mode, align_corners, antialias)


def center_crop_resize_video(clip: np.ndarray, transform_size: Any, use_short_edge: bool = False,
                             top_crop: bool = False, interpolation_mode: str = "bilinear",
                             align_corners: bool = False, antialias: bool = False) -> np.ndarray:
    """MindSpeed-MM's CenterCropResizeVideo: crop to the target's aspect around the centre, then resize."""
    th, tw = _size_of(transform_size, "resize")
    height, width = clip.shape[-2:]
    if use_short_edge:
        new_h = new_w = min(height, width)
    elif height / width > th / tw:
        new_h, new_w = int(width * th / tw), width
    else:
        new_h, new_w = height, int(height / (th / tw))
    top = 0 if top_crop and not use_short_edge else int(round((height - new_h) / 2.0))
    left = int(round((width - new_w) / 2.0))
    cropped = clip[..., top:top + new_h, left:left + new_w]
    return resize(cropped, (th, tw), interpolation_mode, align_corners, antialias)


def to_tensor_video(clip: np.ndarray) -> np.ndarray:
    """MindSpeed-MM's ToTensorVideo: uint8 -> float32 / 255."""
    if clip.dtype != np.uint8:
        raise VideoDataError(f"ToTensorVideo needs uint8 frames, got {clip.dtype}: put it before norm_fun")
    return clip.astype(np.float32) / 255.0


def norm_fun(clip: np.ndarray, mean: Any, std: Any) -> np.ndarray:
    """torchvision's Normalize over the channel axis of (T, C, H, W)."""
    mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)
    return (clip.astype(np.float32) - mean) / std


# trans_type -> (function, whether it takes transform_size)
TRANSFORMS: dict[str, tuple[Callable[..., np.ndarray], bool]] = {
    "ResizeVideo": (resize_video, True),
    "CenterCropResizeVideo": (center_crop_resize_video, True),
    "ToTensorVideo": (to_tensor_video, False),
    "norm_fun": (norm_fun, False),
}


def run_pipeline(clip: np.ndarray, steps: list[dict], transform_size: dict[str, Any]) -> np.ndarray:
    """Apply one of MindSpeed-MM's train_pipeline lists to a (T, C, H, W) clip."""
    for step in steps:
        kind = step.get("trans_type")
        if kind not in TRANSFORMS:
            raise VideoDataError(f"train_pipeline trans_type {kind!r}: mmrun offers {sorted(TRANSFORMS)}")
        function, sized = TRANSFORMS[kind]
        param = dict(step.get("param") or {})
        if sized:
            size = param.pop("transform_size", "auto")
            clip = function(clip, transform_size if size == "auto" else size, **param)
        else:
            clip = function(clip, **param)
    return clip


DEFAULT_VIDEO_ONLY = [
    {"trans_type": "CenterCropResizeVideo", "param": {"transform_size": "auto", "antialias": True}},
    {"trans_type": "norm_fun", "param": {"mean": 0.5, "std": 0.5}},
]


def preprocess_video(video: Video, params: PreprocessParameters, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Frames picked and transformed as MindSpeed-MM's Wan feature extraction does.

    Returns {"video": float32 (C, T, H, W) in [-1, 1], "first_frame": (C, H, W) after the shared pipeline}.
    """
    indices = sample_frame_indices(len(video.frames), video.fps, params, rng, video.path)
    clip = np.ascontiguousarray(video.frames[indices].transpose(0, 3, 1, 2))  # T H W C -> T C H W
    pipeline = params.train_pipeline
    shared = pipeline.get("video_and_first_frame", pipeline.get("video", [{"trans_type": "ToTensorVideo"}]))
    clip = run_pipeline(clip, shared, params.transform_size())
    first_frame = clip[0]
    clip = run_pipeline(clip, pipeline.get("video_only", DEFAULT_VIDEO_ONLY), params.transform_size(False))
    if clip.dtype != np.float32:
        raise VideoDataError("train_pipeline: the frames are still uint8 after it; add ToTensorVideo and norm_fun")
    return {"video": np.ascontiguousarray(clip.transpose(1, 0, 2, 3)), "first_frame": first_frame}
