"""Feature files of video generation: MindSpeed-MM's .pt (as torch.save writes them) and mmrun's safetensors read
to the same arrays; the index; bad files are one line naming the file, the key, expected and received."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from mmrun.data.video import feature_files as ff

TEXT_DIM, LEN = 32, 8


def sample(task: str = "t2v", rng=np.random.default_rng(0)) -> dict[str, np.ndarray]:
    out = {ff.VIDEO: rng.standard_normal((4, 3, 6, 8)).astype(np.float32),
           ff.PROMPT_IDS: rng.standard_normal((LEN, TEXT_DIM)).astype(np.float32),
           ff.PROMPT_MASK: (np.arange(LEN) < 5).astype(np.int64)}
    if task == "i2v":
        out[ff.I2V_CLIP] = rng.standard_normal((257, 16)).astype(np.float32)
        out[ff.I2V_VAE] = rng.standard_normal((8, 3, 6, 8)).astype(np.float32)
    return out


def save_like_mindspeed(features: dict[str, np.ndarray], path, batch_axis: bool = False) -> None:
    """What get_sora_feature.py `_save_sample_features` writes: torch.save of a dict of CPU tensors (bf16 latents
    here, as a bf16 VAE gives; the text encoder's output with a leading axis of 1 when `batch_axis`)."""
    data = {key: torch.from_numpy(value) for key, value in features.items()}
    data[ff.VIDEO] = data[ff.VIDEO].to(torch.bfloat16)
    if batch_axis:
        data[ff.PROMPT_IDS] = data[ff.PROMPT_IDS][None]
        data[ff.PROMPT_MASK] = data[ff.PROMPT_MASK][None]
    torch.save(data, path)


@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_pt_and_safetensors_read_to_the_same_arrays(tmp_path, task):
    features = sample(task)
    save_like_mindspeed(features, tmp_path / "clip_mp4.pt", batch_axis=True)
    from_pt = ff.validate_features(ff.read_feature_file(tmp_path / "clip_mp4.pt"), "clip_mp4.pt", task,
                                   text_dim=TEXT_DIM, in_channels=12 if task == "i2v" else 4)
    bf16_video = torch.from_numpy(features[ff.VIDEO]).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(from_pt[ff.VIDEO], bf16_video)
    assert from_pt[ff.PROMPT_IDS].shape == (LEN, TEXT_DIM) and from_pt[ff.PROMPT_MASK].shape == (LEN,)
    ff.write_feature_file(tmp_path / "clip_mp4.safetensors", from_pt)
    again = ff.read_feature_file(tmp_path / "clip_mp4.safetensors")
    assert sorted(again) == sorted(from_pt)
    for key in from_pt:
        np.testing.assert_array_equal(again[key], from_pt[key])
    assert (tmp_path / "clip_mp4.safetensors").read_bytes()[8:].lstrip().startswith(b"{")  # no pickle: a header


def test_index_and_dataset_follow_mindspeed_layout(tmp_path):
    (tmp_path / "features").mkdir()
    names = [ff.feature_file_name(v, suffix) for v, suffix in (("a/b.mp4", ".pt"), ("c.gif", ".safetensors"))]
    assert names == ["b_mp4.pt", "c_gif.safetensors"]
    save_like_mindspeed(sample(), tmp_path / "features" / names[0])
    ff.write_feature_file(tmp_path / "features" / names[1], sample())
    ff.write_index(tmp_path / "data.jsonl", [{"path": "a/b.mp4", "cap": "x", "file": f"features/{names[0]}"},
                                             {"path": "c.gif", "cap": "y", "file": f"features/{names[1]}"}])
    param = {"dataset_type": "feature",
             "basic_parameters": {"data_path": str(tmp_path / "data.jsonl"), "data_folder": str(tmp_path)}}
    dataset = ff.FeatureDataset.from_dataset_param(param, text_dim=TEXT_DIM)
    assert len(dataset) == 2
    batch = ff.collate([dataset[0], dataset[1]], (ff.VIDEO, ff.PROMPT_IDS, ff.PROMPT_MASK))
    assert batch[ff.VIDEO].shape == (2, 4, 3, 6, 8)


def test_safetensors_reading_imports_no_framework(tmp_path):
    ff.write_feature_file(tmp_path / "s.safetensors", sample())
    code = ("import sys; from mmrun.data.video import feature_files as ff; "
            f"ff.validate_features(ff.read_feature_file({str(tmp_path / 's.safetensors')!r}), 's'); "
            "print(','.join(m for m in ('torch', 'mindspore') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def _error(tmp_path, features, **checks) -> str:
    path = tmp_path / "bad.safetensors"
    ff.write_feature_file(path, features)
    with pytest.raises(ff.FeatureFileError) as info:
        ff.validate_features(ff.read_feature_file(path), path, checks.pop("task", "t2v"), **checks)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and info.value.exit_code == 2
    return message


def test_bad_features_name_file_key_expected_and_received(tmp_path):
    missing = {k: v for k, v in sample().items() if k != ff.PROMPT_MASK}
    assert "key 'prompt_mask' missing" in _error(tmp_path, missing)
    wrong_rank = {**sample(), ff.VIDEO: np.zeros((4, 6, 8), np.float32)}
    assert "'video' expected [C, F, H, W] latents (rank 4), received shape (4, 6, 8)" in _error(tmp_path, wrong_rank)
    message = _error(tmp_path, sample(), text_dim=4096)
    assert "'prompt_ids' last dimension (text_dim) expected 4096, received 32" in message
    assert "'video' channels (in_dim) expected 16, received 4" in _error(tmp_path, sample(), in_channels=16)
    assert "'i2v_clip_feature' missing" in _error(tmp_path, sample(), task="i2v")


def test_bad_files_and_index_are_one_line(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"not a zip")
    torch.save({"video": torch.zeros(1), "fn": print}, tmp_path / "evil.pt")  # a callable: refused by weights_only
    for name, expected in (("x.pt", "weights_only=True"), ("evil.pt", "weights_only=True"),
                           ("none.safetensors", "feature file not found"), ("x.npy", "received suffix '.npy'")):
        if name == "x.npy":
            (tmp_path / name).write_bytes(b"")
        with pytest.raises(ff.FeatureFileError, match=expected) as info:
            ff.read_feature_file(tmp_path / name)
        assert "\n" not in str(info.value)
    (tmp_path / "data.jsonl").write_text(json.dumps({"path": "v.mp4"}) + "\n")
    with pytest.raises(ff.FeatureFileError, match=r"data.jsonl:1: expected an object with a string 'file'"):
        ff.read_index(tmp_path / "data.jsonl")
