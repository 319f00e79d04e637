"""mmrun's CLIP image encoder (Wan2.1 I2V's) against transformers' CLIPVisionModel on a tiny random config (every
weight perturbed): every hidden state, the pooled output and Wan's hidden_states[-2] within 1e-5 in fp32, on
PyTorch and on MindSpore (in the one MindSpore subprocess of the Wan model tests, conftest's wan_frameworks); both
weight layouts (transformers 4.x's `vision_model.` names, as the hub's Wan checkpoint holds them, and transformers
5's); the image processor against transformers' CLIPImageProcessor; one-line errors."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mmrun.backend.errors import UsageError

WORKER = Path(__file__).resolve().parent / "workers" / "wan_vae_run.py"


@pytest.fixture(scope="module")
def worker(wan_refs):
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:
        pytest.skip(str(error))
    spec = importlib.util.spec_from_file_location("mmrun_tests_wan_vae_run", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(model, pixels: np.ndarray) -> dict[str, np.ndarray]:
    import torch
    with torch.no_grad():
        out = model(torch.from_numpy(pixels), output_hidden_states=True)
    expected = {f"clip/hidden_states/{i}": h.numpy() for i, h in enumerate(out.hidden_states)}
    expected["clip/pooler_output"] = out.pooler_output.numpy()
    expected["clip/penultimate"] = out.hidden_states[-2].numpy()  # what Wan reads
    return expected


def assert_equal(ours: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(expected) <= set(ours)
    for key, value in expected.items():
        np.testing.assert_allclose(ours[key], value, rtol=0, atol=1e-5, err_msg=key)


def test_equal_to_transformers_both_layouts(wan_tiny, wan_refs, worker):
    pixels = wan_tiny.clip_cases(wan_refs["clip_dir"])["clip/pixel_values"]
    expected = reference(wan_refs["clip"], pixels)
    assert len(expected) == wan_tiny.CLIP_CONFIG["num_hidden_layers"] + 3
    for directory in (wan_refs["clip_dir"], wan_refs["clip_hub_dir"]):  # transformers 5's names, the hub's
        assert_equal(worker.run_clip(str(directory), pixels), expected)
    assert expected["clip/penultimate"].shape == (2, 17, 32)
    assert np.abs(expected["clip/penultimate"] - expected[f"clip/hidden_states/{len(expected) - 3}"]).max() > 0.1


@pytest.mark.slow
def test_mindspore_equals_transformers(wan_frameworks, wan_refs):
    cases, torch_out, ms_out = wan_frameworks
    expected = reference(wan_refs["clip"], cases["clip/pixel_values"])
    assert_equal(torch_out, expected)
    assert_equal(ms_out, expected)


def test_image_processor_equals_transformers(wan_tiny, tmp_path):
    from transformers import CLIPImageProcessor as Reference

    from mmrun.data.multimodal.clip_image_processing import CLIPImageProcessor

    images = [wan_tiny.picture((40, 28), 0), wan_tiny.picture((20, 50), 1), wan_tiny.picture((300, 224), 2),
              wan_tiny.picture((24, 16), 3).convert("L")]
    for settings in (wan_tiny.CLIP_PROCESSOR, {}):  # the tiny one, and OpenAI CLIP's 224 px defaults (Wan's)
        Reference(**settings).save_pretrained(tmp_path)
        reference = Reference.from_pretrained(tmp_path)
        ours = CLIPImageProcessor.from_pretrained(tmp_path)
        for image in images:
            expected = reference(images=[image], return_tensors="np")["pixel_values"]
            np.testing.assert_allclose(ours([image]), expected, rtol=0, atol=1e-6)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"crop_size": 224, "size": 256}))  # older ints
    assert CLIPImageProcessor.from_pretrained(tmp_path).crop_size == {"height": 224, "width": 224}


def test_errors_are_one_line(wan_refs, worker, tmp_path):
    from mmrun.backend import tensors
    from mmrun.data.gpt_dataset import DatasetConfigError
    from mmrun.data.multimodal.clip_image_processing import CLIPImageProcessor
    from mmrun.models.clip_vision import CLIPVisionModel

    with pytest.raises(UsageError, match="no config.json"):
        CLIPVisionModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "umt5"}))
    with pytest.raises(UsageError, match="model_type 'umt5'.*image_encoder/"):
        CLIPVisionModel.from_pretrained(tmp_path)
    with pytest.raises(DatasetConfigError, match="preprocessor_config.json not found"):
        CLIPImageProcessor.from_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"crop_size": {"height": 2}}))
    with pytest.raises(DatasetConfigError, match="crop_size"):
        CLIPImageProcessor.from_pretrained(tmp_path)
    model = CLIPVisionModel.from_pretrained(wan_refs["clip_dir"])
    with pytest.raises(UsageError, match=r"pixel_values of shape \(1, 3, 16, 16\)"):
        model.penultimate(tensors.from_numpy(np.zeros((1, 3, 16, 16), np.float32)))
