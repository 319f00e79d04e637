"""transformers' CLIPImageProcessor in numpy + Pillow: what Wan2.1 I2V's CLIP image encoder is fed.

    processor = CLIPImageProcessor.from_pretrained("Wan2.1-I2V-14B-480P-Diffusers/image_processor")
    pixels = processor([Image.open("first_frame.png")])      # float32 (1, 3, 224, 224)

The steps and keys of a `preprocessor_config.json`: RGB (`do_convert_rgb`), resize (`size`: shortest_edge, the long
side int(size * long / short), or height and width) with the `resample` filter (bicubic) on the uint8 image,
center crop (`crop_size`, top/left int((H - h) / 2), zero padding where the image is smaller), rescale by
`rescale_factor` and normalize with `image_mean` / `image_std` in float32 (mean and std scaled by 1 / rescale_factor,
as transformers fuses the two).
Equal within 3e-7 to transformers 5.24's CLIPImageProcessor as it runs without torchvision (its Pillow backend,
CLIPImageProcessorPil; tests/models/test_clip_vision.py). With torchvision installed transformers resizes with
torchvision's antialiased kernel instead, which can differ by a grey level at some pixels (not measured here).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from PIL import Image

from mmrun.data.gpt_dataset import DatasetConfigError
from mmrun.data.multimodal.image_processing import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PREPROCESSOR_CONFIG


def _size(value: Any, key: str, source: str) -> dict[str, int]:
    if isinstance(value, int) and not isinstance(value, bool):  # transformers' older files give an int
        return {"height": value, "width": value} if key == "crop_size" else {"shortest_edge": value}
    if isinstance(value, dict) and (set(value) == {"shortest_edge"} or set(value) == {"height", "width"}) \
            and all(isinstance(v, int) and v > 0 for v in value.values()):
        return dict(value)
    raise DatasetConfigError(f"{source}: {key} {value!r}; give {{\"shortest_edge\": N}} or "
                             "{\"height\": H, \"width\": W}" + (" (crop_size: height and width)"
                                                                 if key == "crop_size" else ""))


@dataclass(frozen=True)
class CLIPImageProcessor:
    """The settings of transformers' CLIPImageProcessor (its defaults: OpenAI CLIP's 224 px)."""

    size: dict = None  # type: ignore[assignment]  # {"shortest_edge": 224} by default (set in __post_init__)
    crop_size: dict = None  # type: ignore[assignment]
    resample: int = int(Image.Resampling.BICUBIC)
    do_resize: bool = True
    do_center_crop: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD
    do_convert_rgb: bool = True

    def __post_init__(self) -> None:
        if self.size is None:
            object.__setattr__(self, "size", {"shortest_edge": 224})
        if self.crop_size is None:
            object.__setattr__(self, "crop_size", {"height": 224, "width": 224})

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = PREPROCESSOR_CONFIG) -> "CLIPImageProcessor":
        values: dict[str, Any] = {}
        for key in ("size", "crop_size"):
            if raw.get(key) is not None:
                values[key] = _size(raw[key], key, source)
        for key in ("image_mean", "image_std"):
            if raw.get(key) is not None:
                value = raw[key]
                if not (isinstance(value, (list, tuple)) and len(value) == 3
                        and all(isinstance(v, (int, float)) for v in value)):
                    raise DatasetConfigError(f"{source}: {key} {value!r}; give three numbers (R, G, B)")
                values[key] = tuple(float(v) for v in value)
        for key in ("do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb"):
            if raw.get(key) is not None:
                values[key] = bool(raw[key])
        if raw.get("resample") is not None:
            values["resample"] = int(raw["resample"])
        if raw.get("rescale_factor") is not None:
            values["rescale_factor"] = float(raw["rescale_factor"])
        return cls(**values)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "CLIPImageProcessor":
        """preprocessor_config.json of a directory (a Wan I2V Diffusers directory's image_processor/)."""
        path = os.path.join(directory, PREPROCESSOR_CONFIG)
        if not os.path.isfile(path):
            raise DatasetConfigError(f"{path} not found; pass the image processor's directory (a Wan I2V Diffusers "
                                     "directory's image_processor/)")
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError) as error:
            raise DatasetConfigError(f"{path}: cannot read it as JSON ({error}); restore the file") from None
        if not isinstance(raw, dict):
            raise DatasetConfigError(f"{path}: expected a JSON object, got {type(raw).__name__}; restore the file")
        return cls.from_dict(raw, source=path)

    def _resized(self, image: Image.Image) -> Image.Image:
        if "shortest_edge" in self.size:
            target = self.size["shortest_edge"]
            short, long = sorted(image.size)
            new_short, new_long = target, int(target * long / short)
            width, height = (new_short, new_long) if image.width <= image.height else (new_long, new_short)
        else:
            height, width = self.size["height"], self.size["width"]
        return image.resize((width, height), Image.Resampling(self.resample))

    def _cropped(self, pixels: np.ndarray) -> np.ndarray:
        """(H, W, 3) uint8 -> (crop h, crop w, 3): zero padding first where the image is smaller, as torchvision."""
        height, width = pixels.shape[:2]
        th, tw = self.crop_size["height"], self.crop_size["width"]
        if th > height or tw > width:
            pad_top, pad_left = max(th - height, 0) // 2, max(tw - width, 0) // 2
            pad_bottom, pad_right = (max(th - height, 0) + 1) // 2, (max(tw - width, 0) + 1) // 2
            pixels = np.pad(pixels, ((pad_top, pad_bottom), (pad_left, pad_right), (0, 0)))
            height, width = pixels.shape[:2]
        top, left = int((height - th) / 2.0), int((width - tw) / 2.0)
        return pixels[top:top + th, left:left + tw]

    def __call__(self, images: Sequence[Image.Image]) -> np.ndarray:
        """pixel_values float32 (len(images), 3, crop h, crop w)."""
        out = []
        for image in images:
            if self.do_convert_rgb:
                image = image.convert("RGB")
            if self.do_resize:
                image = self._resized(image)
            pixels = np.asarray(image)
            if self.do_center_crop:
                pixels = self._cropped(pixels)
            values = pixels.astype(np.float32)
            if self.do_rescale and self.do_normalize:  # transformers fuses both: mean and std scaled by 1 / factor
                mean = np.float32(1 / self.rescale_factor) * np.asarray(self.image_mean, np.float32)
                values = (values - mean) / (np.float32(1 / self.rescale_factor) * np.asarray(self.image_std,
                                                                                             np.float32))
            elif self.do_rescale:
                values = values * np.float32(self.rescale_factor)
            elif self.do_normalize:
                values = (values - np.asarray(self.image_mean, np.float32)) / np.asarray(self.image_std, np.float32)
            out.append(values.transpose(2, 0, 1))
        return np.ascontiguousarray(np.stack(out), dtype=np.float32)
