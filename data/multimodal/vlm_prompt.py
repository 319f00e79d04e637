"""One inference prompt for Qwen2-VL / Qwen2.5-VL, as transformers' processor and chat template build it.

MindSpeed-MM's Qwen2VlPipeline sends one user message whose content is the image(s) then the text through the
processor's chat template with the generation prompt: the default system turn, `<|im_start|>user\\n`, a
`<|vision_start|><|image_pad|>...<|vision_end|>` block per image (one pad per merged patch), the text,
`<|im_end|>\\n<|im_start|>assistant\\n`. Here the same ids come from the data pipeline's template and image
processor (numpy + Pillow: identical on both frameworks). `decode_stream` turns generated ids into the text
to print as they arrive.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import io
from typing import Sequence

import numpy as np
from PIL import Image

from mmrun.backend.errors import UsageError
from mmrun.data.multimodal.image_processing import ImageProcessorConfig, preprocess_images, to_rgb
from mmrun.data.multimodal.templates import IMAGE_PLACEHOLDER, USER, ChatTemplate, expand_placeholders


class ImageDecodeError(UsageError):
    """An image file (or base64 string) that Pillow cannot decode."""


def open_image(source: str | bytes, what: str) -> Image.Image:
    """A decoded RGB image from a path, or from raw bytes (`what` names it in the error)."""
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image.load()
            return to_rgb(image.copy())
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(f"{what}: cannot decode the image ({exc}); pass a JPEG/PNG/... file Pillow "
                               "reads") from None


def decode_base64_image(text: str, what: str) -> Image.Image:
    """A base64-encoded image (VLMEvalKit's TSV `image` column)."""
    try:
        raw = base64.b64decode(text, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise ImageDecodeError(f"{what}: the image is not valid base64 ({exc})") from None
    return open_image(raw, what)


def with_pixel_limits(config: ImageProcessorConfig, min_pixels: int | None, max_pixels: int | None
                      ) -> ImageProcessorConfig:
    """The processor's settings with the inference json's min_pixels / max_pixels where given."""
    changes = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    updated = dataclasses.replace(config, **changes)
    if updated.min_pixels > updated.max_pixels:
        raise UsageError(f"min_pixels {updated.min_pixels} is above max_pixels {updated.max_pixels}; lower "
                         "min_pixels")
    return updated


def encode_prompt(tokenizer, template: ChatTemplate, text: str, images: Sequence[Image.Image],
                  image_config: ImageProcessorConfig, system: str | None = None) -> dict[str, np.ndarray]:
    """input_ids (1, S) int64 and, with images, pixel_values (N, 1176) and image_grid_thw (n, 3)."""
    out: dict[str, np.ndarray] = {}
    tokens: list[int] = []
    if images:
        out["pixel_values"], out["image_grid_thw"] = preprocess_images(list(images), image_config)
        tokens = [int(np.prod(g)) // image_config.merge_size ** 2 for g in out["image_grid_thw"]]
    content = IMAGE_PLACEHOLDER * len(images) + text
    message = expand_placeholders([{"role": USER, "content": content}], template, tokens, [])[0]
    out["input_ids"] = user_turn_ids(tokenizer, template, message["content"], system)
    return out


def user_turn_ids(tokenizer, template: ChatTemplate, content: str, system: str | None = None) -> np.ndarray:
    """(1, S) int64 ids of the system prompt (the template's default when None) and one user turn whose
    placeholders are already expanded, ready for the assistant's answer."""
    system = template.default_system if system is None else system
    formatted = (template.system_slot.format(content=system) if system else "") + \
        template.slots[USER].format(content=content)
    return np.asarray([tokenizer.tokenize(formatted)], dtype=np.int64)


class TextStream:
    """Generated ids -> the new text to print: decodes everything so far (minus `hidden` ids such as
    <|im_end|>) and returns what was not printed yet, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer, hidden: Sequence[int] = ()) -> None:
        self.tokenizer, self.hidden = tokenizer, set(hidden)
        self.ids: list[int] = []
        self.printed = 0

    def push(self, token: int) -> str:
        if token not in self.hidden:
            self.ids.append(int(token))
        text = self.tokenizer.detokenize(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.printed = text[self.printed:], len(text)
        return new

    def flush(self) -> str:
        """What is left at the end (a held-back partial character is printed as the decoder renders it)."""
        text = self.tokenizer.detokenize(self.ids)
        new, self.printed = text[self.printed:], len(text)
        return new

    @property
    def text(self) -> str:
        return self.tokenizer.detokenize(self.ids)
