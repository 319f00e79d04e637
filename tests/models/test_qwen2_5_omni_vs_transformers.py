"""mmrun's Qwen2.5-Omni thinker against transformers' Qwen2_5OmniThinkerForConditionalGeneration (fp32).

Same weights (read from transformers' save_pretrained directory), same batch: logits at real tokens, the loss
and the gradient of every parameter within 1e-5, for text alone, two images beside a padded text-only row,
a video, audio alone (three audios, one cut into 5 chunks), audio beside an image, and a video with its audio
track interleaved (use_audio_in_video); mmrun computes its own TMRoPE positions, which equal transformers'
get_rope_index exactly. MindSpore == PyTorch on the same cases (one subprocess).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOL = 1e-5
WORKER = Path(__file__).resolve().parent / "workers" / "qwen2_5_omni_run.py"
AUDIO_BATCHES = ("audio_batch", "audio_image_batch", "video_audio_batch")
VISION_BATCHES = ("image_batch", "video_batch", "audio_image_batch", "video_audio_batch")


@pytest.fixture(scope="module")
def thinker(tiny_omni):
    pytest.importorskip("transformers")
    return tiny_omni.hf_model()


@pytest.fixture(scope="module")
def thinker_dir(thinker, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("omni_thinker")
    thinker.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def run(worker):
    """workers/qwen2_5_omni_run.py in this (PyTorch) process."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mmrun_tests_qwen2_5_omni_run", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ours(run, thinker_dir):
    from mmrun.models.qwen2_5_omni import from_pretrained
    return from_pretrained(str(thinker_dir))


@pytest.mark.parametrize("batch_name", ["text_batch", "image_batch", "video_batch", "audio_batch",
                                        "audio_image_batch", "video_audio_batch"])
def test_logits_loss_and_every_gradient_equal_transformers(tiny_omni, thinker, ours, run, batch_name):
    batch = getattr(tiny_omni, batch_name)()
    reference = tiny_omni.hf_forward_backward(thinker, batch)
    mine = run.forward_backward(ours, batch)
    real = batch["attention_mask"] == 1  # transformers masks padded queries too; their logits are not used
    np.testing.assert_allclose(mine["logits"][real], reference["logits"][real], rtol=0, atol=TOL)
    np.testing.assert_allclose(mine["loss"], reference["loss"], rtol=0, atol=TOL)
    assert sorted(k[5:] for k in mine if k.startswith("grad/")) == sorted(reference["grads"])
    for name, grad in reference["grads"].items():
        np.testing.assert_allclose(mine[f"grad/{name}"], grad, rtol=0, atol=TOL, err_msg=name)
    # the encoders really took part (or not)
    assert (np.abs(mine["grad/audio_tower.conv1.weight"]).max() > 1e-4) == (batch_name in AUDIO_BATCHES)
    assert (np.abs(mine["grad/visual.blocks.0.attn.v.weight"]).max() > 1e-4) == (batch_name in VISION_BATCHES)


def test_tmrope_positions_equal_transformers_get_rope_index(tiny_omni, thinker, ours):
    from mmrun.data.multimodal.omni_rope_index import get_rope_index

    batches = {name: getattr(tiny_omni, name)() for name in ("text_batch", "image_batch", "video_batch",
                                                             "audio_batch", "audio_image_batch",
                                                             "video_audio_batch")}
    # two rows, each its own kind: an image row (grids consumed across rows) before a video-with-audio row
    image, video = batches["image_batch"], batches["video_audio_batch"]
    rows = [image["input_ids"][0], video["input_ids"][0]]
    length = max(len(r) for r in rows)
    ids = np.zeros((2, length), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    batches["mixed"] = {"input_ids": ids, "attention_mask": mask, "image_grid_thw": image["image_grid_thw"],
                        "video_grid_thw": video["video_grid_thw"], "video_second_per_grid": np.array([0.5], np.float32),
                        "feature_attention_mask": video["feature_attention_mask"], "use_audio_in_video": np.array(True)}
    for name, batch in batches.items():
        audio_mask = batch.get("feature_attention_mask")
        positions, deltas = get_rope_index(
            ours.rope_config, batch["input_ids"], batch.get("image_grid_thw"), batch.get("video_grid_thw"),
            batch["attention_mask"], bool(batch.get("use_audio_in_video", False)),
            None if audio_mask is None else audio_mask.sum(1), batch.get("video_second_per_grid"))
        np.testing.assert_array_equal(positions, tiny_omni.hf_rope_index(thinker, batch), err_msg=name)
        real = batch["attention_mask"] == 1
        assert np.array_equal(deltas[:, 0], positions.max(axis=(0, 2)) + 1 - real.sum(1)), name


def test_whole_model_checkpoint_reads_as_its_thinker(tiny_omni, thinker, thinker_dir, tmp_path):
    from mmrun.models.qwen2_5_omni.hf_checkpoint import hf_parameter_names, load_hf_directory

    whole = tiny_omni.whole_model_dir(thinker, tmp_path / "whole")
    config, arrays = load_hf_directory(whole)  # thinker.* read, talker.* skipped
    thinker_config, thinker_arrays = load_hf_directory(thinker_dir)
    assert config == thinker_config and config.audio.n_window == 4 and config.position_id_per_seconds == 2
    assert sorted(arrays) == sorted(thinker_arrays) == sorted(hf_parameter_names(config))
    for name, array in thinker_arrays.items():
        np.testing.assert_array_equal(arrays[name], array, err_msg=name)
    assert arrays["audio_tower.conv1.weight"].shape == (32, 8 * 3)  # Conv1d (D, mel, 3) flattened


def test_audio_tokens_that_do_not_fit_the_features_are_one_line_error(tiny_omni, ours):
    from mmrun.backend import tensors

    batch = tiny_omni.audio_batch()
    mask = batch["feature_attention_mask"].copy()
    mask[2, 30:] = 0  # the last audio cut to 30 frames: 7 tokens, not the 9 its text holds
    inputs = {k: tensors.from_numpy(v) for k, v in {**batch, "feature_attention_mask": mask}.items()}
    with pytest.raises(ValueError, match=r"input_ids hold 16 audio tokens .* give 14 features") as error:
        ours(**inputs)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["audio_batch", "video_audio_batch", "image_batch"])
def test_greedy_generation_equals_transformers_generate(tiny_omni, thinker, ours, run, name):
    prompt = tiny_omni.prompt(name)
    expected = tiny_omni.hf_generate(thinker, prompt, 6)
    assert run.generate(ours, prompt).tolist() == expected
    assert run.generate(ours, prompt, use_cache=False).tolist() == expected  # re-running the prompt: the same


@pytest.mark.slow
def test_mindspore_equals_pytorch(tiny_omni, run, thinker_dir, tmp_path):
    pytest.importorskip("mindspore")
    names = ("text_batch", "image_batch", "video_batch", "audio_batch", "audio_image_batch", "video_audio_batch")
    cases = {}
    for name in names:
        cases.update({f"{name}/{k}": v for k, v in getattr(tiny_omni, name)().items()})
        cases[f"{name}/dir"] = np.array(str(thinker_dir))
    for name in ("audio_batch", "video_audio_batch"):  # greedy generation: the same tokens
        cases.update({f"generate-{name}/{k}": v for k, v in tiny_omni.prompt(name).items()})
        cases[f"generate-{name}/dir"], cases[f"generate-{name}/kind"] = np.array(str(thinker_dir)), np.array("generate")
    np.savez(tmp_path / "cases.npz", **cases)
    env = {**os.environ, "MMRUN_AI_FRAMEWORK": "mindspore", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "cases.npz"), str(tmp_path / "ms.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ms, torch_out = dict(np.load(tmp_path / "ms.npz")), run.run_cases(cases)
    assert sorted(ms) == sorted(torch_out)
    for name in ("audio_batch", "video_audio_batch"):
        np.testing.assert_array_equal(ms[f"generate-{name}/tokens"], torch_out[f"generate-{name}/tokens"])
    for name in names:
        real = cases[f"{name}/attention_mask"] == 1
        np.testing.assert_allclose(ms[f"{name}/logits"][real], torch_out[f"{name}/logits"][real], rtol=0, atol=1e-5)
        np.testing.assert_allclose(ms[f"{name}/loss"], torch_out[f"{name}/loss"], rtol=1e-6, atol=1e-5)
        grads = [k for k in torch_out if k.startswith(f"{name}/grad/")]
        assert len(grads) > 100
        for key in grads:
            np.testing.assert_allclose(ms[key], torch_out[key], rtol=0, atol=1e-5, err_msg=key)


def test_mindspeed_mm_model_json_is_the_thinker_transformers_builds(tmp_path):
    """scripts/qwen2_5omni/model_tiny.json (MindSpeed-MM's model_7b.json shrunk) -> the thinker config; transformers
    builds that model from to_hf_config(), and its save_pretrained directory reads back as the same config with
    the same parameter names and shapes (what pretrain_vlm's --load of an HF directory checks)."""
    import dataclasses
    import json

    transformers = pytest.importorskip("transformers")
    from mmrun.models.qwen2_5_omni.configuration import OmniConfig
    from mmrun.models.qwen2_5_omni.hf_checkpoint import load_hf_directory
    from mmrun.models.qwen2_5_omni.model_json import parse_model_json

    path = Path(__file__).resolve().parents[2] / "scripts" / "qwen2_5omni" / "model_tiny.json"
    spec = parse_model_json(json.loads(path.read_text()), str(path))
    config = OmniConfig.from_hf_config(spec.hf_config)
    assert (config.audio.num_mel_bins, config.audio.n_window, config.vision.window_size, config.text.vocab_size,
            config.image_token_id, config.audio_token_id) == (16, 100, 112, 152064, 151655, 151646)
    assert spec.freeze == {"vision_encoder": True, "vision_projector": True, "text_decoder": False,
                           "audio_encoder": True}
    hf = transformers.Qwen2_5OmniThinkerForConditionalGeneration(
        transformers.Qwen2_5OmniThinkerConfig(**config.to_hf_config()))
    hf.save_pretrained(tmp_path)
    loaded, arrays = load_hf_directory(tmp_path)
    assert dataclasses.replace(loaded, torch_dtype=None) == config
    # a downloaded config.json may give max_position_embeddings 32768 where model.json says 128000: the same network
    from mmrun.models.qwen2_5_omni.configuration import network_dict
    downloaded = dataclasses.replace(loaded, text=dataclasses.replace(loaded.text, max_position_embeddings=32768))
    assert network_dict(downloaded) == network_dict(config) != network_dict(
        dataclasses.replace(loaded, audio=dataclasses.replace(loaded.audio, n_window=50)))
    shapes = {name: tuple(p.shape) for name, p in hf.named_parameters()}
    assert len(arrays) == len(shapes)
    assert arrays["audio_tower.conv1.weight"].shape == (32, 16 * 3)
