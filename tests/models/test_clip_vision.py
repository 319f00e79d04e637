"""mmrun's CLIP image encoder (Wan2.1 I2V's) against transformers' CLIPVisionModel on a tiny random config (every
weight perturbed): every hidden state, the pooled output and Wan's hidden_states[-2] within 1e-5 in fp32, on
PyTorch and (one subprocess) MindSpore; both weight layouts (transformers 4.x's `vision_model.` names, as the hub's
Wan checkpoint holds them, and transformers 5's); the image processor against transformers' CLIPImageProcessor;
one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmrun.backend.errors import UsageError

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def clip(wan_tiny, tmp_path_factory):
    """(transformers model, transformers 5 directory, transformers 4.x-layout directory, pixels)."""
    pytest.importorskip("transformers")
    from mmrun import backend
    try:
        backend.select("pytorch", "tests/models: the in-process side of the comparisons runs PyTorch")
    except backend.BackendError as error:
        pytest.skip(str(error))
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("clip")
    model = wan_tiny.transformers_clip()
    encoder_dir, _ = wan_tiny.clip_dirs(root / "new", model)
    old = root / "old"  # the hub's layout: vision_model.* names and the position_ids buffer
    old.mkdir()
    (old / "config.json").write_text((encoder_dir / "config.json").read_text())
    arrays = {f"vision_model.{k}": v.numpy() for k, v in model.state_dict().items()}
    arrays["vision_model.embeddings.position_ids"] = np.arange(17, dtype=np.int64)[None]
    save_file(arrays, str(old / "model.safetensors"))
    pixels = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    return model, encoder_dir, old, pixels


def reference(model, pixels):
    import torch
    with torch.no_grad():
        out = model(torch.from_numpy(pixels), output_hidden_states=True)
    return [h.numpy() for h in out.hidden_states], out.pooler_output.numpy()


def test_equal_to_transformers_both_layouts(clip, wan_tiny):
    model, new, old, pixels = clip
    worker = _worker()
    hidden, pooled = reference(model, pixels)
    for directory in (new, old):
        ours = worker.run(str(directory), pixels)
        assert len(hidden) == wan_tiny.CLIP_CONFIG["num_hidden_layers"] + 1
        for i, expected in enumerate(hidden):
            np.testing.assert_allclose(ours[f"hidden_states/{i}"], expected, rtol=0, atol=1e-5)
        np.testing.assert_allclose(ours["pooler_output"], pooled, rtol=0, atol=1e-5)
        np.testing.assert_allclose(ours["penultimate"], hidden[-2], rtol=0, atol=1e-5)
    assert ours["penultimate"].shape == (2, 17, 32) and np.abs(hidden[-2] - hidden[-1]).max() > 0.1


def test_mindspore_equals_transformers(clip, tmp_path):
    pytest.importorskip("mindspore")
    model, _, old, pixels = clip
    np.savez(tmp_path / "cases.npz", dir=np.array(str(old)), pixel_values=pixels)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(HERE / "workers" / "clip_vision_run.py"), str(tmp_path / "cases.npz"),
                           str(tmp_path / "ms.npz")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ours = dict(np.load(tmp_path / "ms.npz"))
    hidden, pooled = reference(model, pixels)
    for i, expected in enumerate(hidden):
        np.testing.assert_allclose(ours[f"hidden_states/{i}"], expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours["pooler_output"], pooled, rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours["penultimate"], hidden[-2], rtol=0, atol=1e-5)


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


def test_errors_are_one_line(clip, tmp_path):
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
    from mmrun.backend import tensors
    model = CLIPVisionModel.from_pretrained(clip[1])
    with pytest.raises(UsageError, match=r"pixel_values of shape \(1, 3, 16, 16\)"):
        model.penultimate(tensors.from_numpy(np.zeros((1, 3, 16, 16), np.float32)))


def _worker():
    import importlib.util
    spec = importlib.util.spec_from_file_location("mmrun_tests_clip_vision_run", HERE / "workers" / "clip_vision_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
