"""The numpy + Pillow Qwen2-VL processor equals transformers' PIL processor; MindSpeed-MM's pre-resize."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from PIL import Image

from mmrun.data.gpt_dataset import DatasetConfigError
from mmrun.data.multimodal.image_processing import (ImageProcessorConfig, preprocess_images, preprocess_video,
                                                     regularize_image, smart_resize)


@pytest.fixture(scope="module")
def reference():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)


def _image(height, width, mode, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    return Image.fromarray(pixels, "RGBA").convert(mode)


# (height, width, mode): no resize, resize, 70 px (2.5 x 28 rounds to 2 -> 56), shrink to max_pixels,
# grow to min_pixels, and grayscale / RGBA / palette / LA / CMYK inputs converted to RGB.
CASES = [(56, 56, "RGB"), (70, 98, "RGB"), (100, 333, "L"), (300, 400, "RGBA"), (57, 140, "P"), (30, 30, "LA"),
         (84, 70, "CMYK")]


@pytest.mark.parametrize("height,width,mode", CASES)
def test_equal_to_transformers_pil_processor(reference, height, width, mode):
    image = _image(height, width, mode)
    want = reference(images=[image], return_tensors="np")
    pixel_values, grid = preprocess_images([image], ImageProcessorConfig(min_pixels=56 * 56, max_pixels=28 * 28 * 64))
    assert pixel_values.dtype == np.float32 and grid.dtype == np.int64
    np.testing.assert_array_equal(grid, want["image_grid_thw"])
    np.testing.assert_allclose(pixel_values, want["pixel_values"], rtol=0, atol=1e-6)


def test_several_images_concatenate(reference):
    images = [_image(56, 84, "RGB", 1), _image(140, 56, "RGB", 2)]
    want = reference(images=images, return_tensors="np")
    pixel_values, grid = preprocess_images(images, ImageProcessorConfig(min_pixels=56 * 56, max_pixels=28 * 28 * 64))
    assert grid.tolist() == [[1, 4, 6], [1, 10, 4]] == want["image_grid_thw"].tolist()
    assert pixel_values.shape == (4 * 6 + 10 * 4, 1176)
    np.testing.assert_allclose(pixel_values, want["pixel_values"], rtol=0, atol=1e-6)


def test_smart_resize_rounds_half_to_even_and_refuses_thin_images():
    assert smart_resize(70, 70) == (56, 56)  # 2.5 -> 2
    assert smart_resize(98, 98) == (112, 112)  # 3.5 -> 4
    assert smart_resize(1000, 1000, max_pixels=28 * 28 * 16) == (112, 112)
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):
        smart_resize(28, 28 * 201)


def test_video_frames_make_temporal_patches():
    config = ImageProcessorConfig(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    frame = _image(56, 84, "RGB", 3)
    image_values, image_grid = preprocess_images([frame], config)
    video_values, video_grid = preprocess_video([frame, frame], config)
    np.testing.assert_array_equal(video_values, image_values)  # an image is a two-frame still video
    assert video_grid.tolist() == image_grid.tolist() == [[1, 4, 6]]
    frames = [_image(56, 84, "RGB", s) for s in range(3)]
    values, grid = preprocess_video(frames, config)  # odd: the last frame is repeated
    assert grid.tolist() == [[2, 4, 6]] and values.shape == (48, 1176)
    last_alone, _ = preprocess_video([frames[2], frames[2]], config)
    np.testing.assert_array_equal(values[24:], last_alone)
    first_pair, _ = preprocess_video(frames[:2], config)
    np.testing.assert_array_equal(values[:24], first_pair)
    # within a patch, values are (channel, frame, row, column): frame 0 and frame 1 differ
    patch = first_pair[0].reshape(3, 2, 14, 14)
    assert not np.array_equal(patch[:, 0], patch[:, 1])


def test_mindspeed_pre_resize():
    small = regularize_image(_image(20, 100, "RGBA"), max_pixels=768 * 768, min_pixels=0)
    assert small.mode == "RGB" and small.size == (100, 28)  # short side stretched to 28, alpha dropped
    big = regularize_image(_image(400, 300, "RGB"), max_pixels=100 * 100, min_pixels=0)
    assert big.size == (86, 115)  # int(300 * sqrt(1e4 / 1.2e5)), nearest neighbour
    grown = regularize_image(_image(30, 30, "RGB"), max_pixels=768 * 768, min_pixels=60 * 60)
    assert grown.size == (60, 60)
    thin = regularize_image(_image(28, 28 * 210, "RGB"), max_pixels=10 ** 8, min_pixels=0)
    assert thin.size == (28 * 180, 28)


def test_config_from_pretrained_both_spellings(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"min_pixels": 100, "max_pixels": 5000, "image_processor_type": "Qwen2VLImageProcessor"}))
    assert ImageProcessorConfig.from_pretrained(str(tmp_path)).max_pixels == 5000
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": 200, "longest_edge": 6000}, "merge_size": 2}))
    config = ImageProcessorConfig.from_pretrained(str(tmp_path))
    assert (config.min_pixels, config.max_pixels, config.patch_dim) == (200, 6000, 1176)
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"max_pixels": 7000}))
    assert ImageProcessorConfig.from_pretrained(str(tmp_path), video=True).max_pixels == 7000
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": "14"}))
    with pytest.raises(DatasetConfigError, match=r"'patch_size' has the wrong type. Received: str '14'; expected int"):
        ImageProcessorConfig.from_pretrained(str(tmp_path))
    with pytest.raises(DatasetConfigError, match="preprocessor_config.json not found"):
        ImageProcessorConfig.from_pretrained(str(tmp_path / "nowhere"))
