"""mmrun's Qwen3-VL against transformers' Qwen3VLForConditionalGeneration (fp32), and PyTorch against MindSpore.

One tiny random model (tests/models/tiny_qwen3_vl.py: every weight perturbed, DeepStack after two ViT
blocks, a learned position table resampled to a non-square grid, explicit head_dim, interleaved M-RoPE with
all three rows used) written by transformers' save_pretrained and loaded by mmrun from that directory.
For one image + text, an image and a 2-frame video, and text alone: logits at real tokens, the loss and the
gradient of every parameter within 1e-5 of transformers'; MindSpore (one subprocess, workers/qwen2_vl_run.py) within 1e-5 of
PyTorch on the image + video and text-only cases.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOL = 1e-5
BATCHES = ("image_batch", "image_video_batch", "text_batch")
MINDSPORE_BATCHES = ("image_video_batch", "text_batch")  # the image case is inside the first


@pytest.fixture(scope="module")
def hf3(tiny3, tmp_path_factory):
    """(transformers model, its save_pretrained directory)."""
    pytest.importorskip("transformers")
    model = tiny3.hf_model()
    path = tmp_path_factory.mktemp("qwen3_vl")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def runs(tiny3, worker, hf3):
    """batch name -> (batch with transformers' positions, transformers' results, mmrun PyTorch results)."""
    from mmrun.models.qwen3_vl import from_pretrained

    model, path = hf3
    ours = from_pretrained(str(path))
    out = {}
    for name in BATCHES:
        batch = getattr(tiny3, name)()
        reference = tiny3.hf_forward_backward(model, batch)
        # transformers' own positions, so this compares the model; the rule is checked below.
        batch = {**batch, "position_ids": tiny3.hf_position_ids(model, batch)}
        out[name] = (batch, reference, worker.forward_backward(ours, batch))
    return out


@pytest.mark.parametrize("batch_name", BATCHES)
def test_logits_loss_and_every_gradient_equal_transformers(runs, batch_name):
    batch, reference, ours = runs[batch_name]
    real = batch["attention_mask"] == 1
    np.testing.assert_allclose(ours["logits"][real], reference["logits"][real], rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["loss"], reference["loss"], rtol=0, atol=TOL)
    assert sorted(k[5:] for k in ours if k.startswith("grad/")) == sorted(reference["grads"])
    for name, grad in reference["grads"].items():
        np.testing.assert_allclose(ours[f"grad/{name}"], grad, rtol=0, atol=TOL, err_msg=name)
    # The ViT, its learned positions and both DeepStack mergers took part (or, text alone, none did).
    for name in ("model.visual.pos_embed.weight", "model.visual.deepstack_merger_list.0.linear_fc2.weight",
                 "model.visual.deepstack_merger_list.1.norm.weight", "model.visual.blocks.2.attn.qkv.weight"):
        assert (np.abs(ours[f"grad/{name}"]).max() > 1e-4) == (batch_name != "text_batch"), name


def test_positions_computed_in_the_model_equal_transformers(tiny3, hf3, runs):
    """Without position_ids the model computes them (each video frame its own grid) as transformers does."""
    from mmrun.backend import tensors
    from mmrun.models.qwen3_vl import from_pretrained

    batch, reference, _ = runs["image_video_batch"]
    keys = ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
    out = from_pretrained(str(hf3[1]))(**{k: tensors.from_numpy(batch[k]) for k in keys})
    real = batch["attention_mask"] == 1
    np.testing.assert_allclose(tensors.to_numpy(out["logits"])[real], reference["logits"][real], rtol=0, atol=TOL)
    assert out["loss_dict"] == {}


def test_config_round_trips_through_transformers(hf3, tmp_path):
    import transformers

    from mmrun.models.qwen3_vl import load_hf_config
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig

    config = load_hf_config(hf3[1])
    assert config.text.head_dim == 16 and config.vision.deepstack_visual_indexes == (0, 2)
    theirs = transformers.Qwen3VLConfig(**config.to_hf_config())
    assert Qwen3VLConfig.from_hf_config(theirs.to_dict()) == config
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    with pytest.raises(ValueError, match="model_type 'qwen3_moe', not Qwen3-VL.*qwen3_vl or qwen3_vl_moe"):
        load_hf_config(tmp_path)


@pytest.mark.slow
def test_mindspore_equals_pytorch(tiny3, hf3, runs, tmp_path):
    pytest.importorskip("mindspore")
    cases: dict[str, np.ndarray] = {}
    for name in MINDSPORE_BATCHES:
        cases.update({f"{name}/{k}": v for k, v in runs[name][0].items()})
        cases[f"{name}/dir"] = np.array(str(hf3[1]))
    np.savez(tmp_path / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    worker = Path(__file__).resolve().parent / "workers" / "qwen2_vl_run.py"
    done = subprocess.run([sys.executable, str(worker), str(tmp_path / "cases.npz"), str(tmp_path / "ms.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ms = dict(np.load(tmp_path / "ms.npz"))
    for name in MINDSPORE_BATCHES:
        batch, _, torch_out = runs[name]
        real = batch["attention_mask"] == 1
        np.testing.assert_allclose(ms[f"{name}/logits"][real], torch_out["logits"][real], rtol=0, atol=TOL)
        np.testing.assert_allclose(ms[f"{name}/loss"], torch_out["loss"], rtol=0, atol=TOL)
        grads = [k for k in torch_out if k.startswith("grad/")]
        assert sorted(grads) == sorted(k[len(name) + 1:] for k in ms if k.startswith(f"{name}/grad/"))
        for key in grads:
            np.testing.assert_allclose(ms[f"{name}/{key}"], torch_out[key], rtol=0, atol=TOL, err_msg=key)


def test_freeze_as_mindspeed_mm_and_load_checks_the_config(hf3):
    """MindSpeed-MM's Qwen3-VL ViT keeps pos_embed and the DeepStack layers trainable when the encoder is frozen;
    --load of an HF directory refuses a model.json describing another network."""
    from mmrun.backend.errors import UsageError
    from mmrun.models.qwen3_vl import from_pretrained, load_hf_config
    from mmrun.models.qwen3_vl.hf_checkpoint import open_for_model

    model = from_pretrained(str(hf3[1]))
    counts = model.freeze(vision_encoder=True, vision_projector=True)
    trained = {name for name, param in model.named_parameters() if param.requires_grad}
    assert {n for n in trained if n.startswith("model.visual.")} == {
        n for n, _ in model.named_parameters()
        if n.startswith(("model.visual.pos_embed.", "model.visual.deepstack_merger_list."))}
    assert counts == {"vision_encoder": 2 + 3 * 12, "vision_projector": 6, "text_decoder": 0}
    config = load_hf_config(hf3[1])
    assert len(open_for_model(hf3[1], config, "model.json")) == len(list(model.named_parameters()))
    config.text.num_hidden_layers = 3
    with pytest.raises(UsageError, match="describes another model than model.json.*num_hidden_layers"):
        open_for_model(hf3[1], config, "model.json")
