"""MultimodalDataset from data.json: validation messages, bad samples, truncation, collate, worker loader, demo."""
from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
from PIL import Image

from mmrun.data.gpt_dataset import DatasetConfigError
from mmrun.data.multimodal.collate import collate
from mmrun.data.multimodal.demo import make_demo, special_token_ids_for_model_config
from mmrun.data.workers import build_dataloader
from mmrun.data.multimodal.mllm_dataset import MultimodalDataset, SampleError
from mmrun.data.multimodal.rope_index import get_rope_index
from mmrun.data.multimodal.templates import IGNORE_INDEX


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    paths = make_demo(str(tmp_path_factory.mktemp("demo")), num_samples=24, seed=7)
    with open(paths["data_json"], encoding="utf-8") as f:
        paths["param"] = json.load(f)["dataset_param"]
    return paths


def _listing(directory):
    return sorted((p, os.path.getmtime(os.path.join(r, p))) for r, _, files in os.walk(directory) for p in files)


def _param(demo, dataset_file, **basic):
    param = copy.deepcopy(demo["param"])
    param["basic_parameters"].update(dataset=str(dataset_file), **basic)
    return param


def test_demo_dataset_samples(demo):
    dataset = MultimodalDataset(demo["param"], seq_length=128)
    assert len(dataset) == 24
    sample = dataset[0]
    assert sample["input_ids"].dtype == np.int64 and sample["labels"].shape == sample["input_ids"].shape
    assert sample["pixel_values"].dtype == np.float32 and sample["pixel_values"].shape[1] == 1176
    assert sample["image_grid_thw"].dtype == np.int64 and sample["image_grid_thw"].shape == (1, 3)
    pads = int((sample["input_ids"] == dataset.token_ids["image_pad"]).sum())
    assert pads == int(np.prod(sample["image_grid_thw"])) // 4 <= 16
    answer = dataset.tokenizer.detokenize(sample["labels"][sample["labels"] != IGNORE_INDEX].tolist())
    with open(demo["dataset"], encoding="utf-8") as f:
        assert answer == json.load(f)[0]["messages"][1]["content"] + "<|im_end|>\n"
    text_only = dataset[7]  # every eighth sample has no image
    assert "pixel_values" not in text_only and "image_grid_thw" not in text_only
    ids = special_token_ids_for_model_config(demo["model_dir"])
    assert ids["image_token_id"] == dataset.token_ids["image_pad"] == dataset.rope_config.image_token_id


def test_demo_is_deterministic(demo, tmp_path):
    again = make_demo(str(tmp_path), num_samples=24, seed=7)
    for name in ("tokenizer.json", "preprocessor_config.json"):
        assert (open(os.path.join(again["model_dir"], name)).read()
                == open(os.path.join(demo["model_dir"], name)).read())
    assert open(again["dataset"]).read() == open(demo["dataset"]).read()
    assert open(os.path.join(os.path.dirname(again["dataset"]), "images", "0003.png"), "rb").read() == \
        open(os.path.join(os.path.dirname(demo["dataset"]), "images", "0003.png"), "rb").read()


def test_collate_shapes_padding_and_positions(demo):
    dataset = MultimodalDataset(demo["param"], seq_length=128)
    samples = [dataset[i] for i in (0, 7, 1)]  # image, text only, image
    batch = dataset.collate_fn(samples)
    longest = max(len(s["input_ids"]) for s in samples)
    length = -(-longest // 8) * 8
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["labels"].shape == (3, length)
    assert all(batch[k].dtype == np.int64 for k in ("input_ids", "attention_mask", "labels", "position_ids"))
    assert batch["position_ids"].shape == (3, 3, length)
    assert batch["pixel_values"].shape == (len(samples[0]["pixel_values"]) + len(samples[2]["pixel_values"]), 1176)
    assert batch["image_grid_thw"].tolist() == [samples[0]["image_grid_thw"][0].tolist(),
                                                samples[2]["image_grid_thw"][0].tolist()]
    n = len(samples[1]["input_ids"])
    assert batch["attention_mask"][1].tolist() == [1] * n + [0] * (length - n)
    assert (batch["labels"][1, n:] == IGNORE_INDEX).all()
    assert (batch["input_ids"][1, n:] == dataset.token_ids["pad"]).all()
    want, _ = get_rope_index(batch["input_ids"], batch["image_grid_thw"], None, batch["attention_mask"],
                             **dataset.rope_config.kwargs())
    np.testing.assert_array_equal(batch["position_ids"], want)
    again = dataset.collate_fn([dataset[i] for i in (0, 7, 1)])
    assert all(np.array_equal(batch[k], again[k]) for k in batch)  # deterministic
    text = collate([samples[1]], 0, dataset.rope_config)
    assert "pixel_values" not in text and "image_grid_thw" not in text
    # never longer than max_length (the dataset binds --seq-length)
    capped = collate([samples[1]], 0, dataset.rope_config, max_length=n + 1)
    assert capped["input_ids"].shape[1] == n + 1


def test_worker_loader_equals_in_process(demo):
    dataset = MultimodalDataset(demo["param"], seq_length=128)
    batches = [[0, 1], [2, 3], [7, 8], [4, 5]]
    inline = list(build_dataloader(dataset, batches, dataset.collate_fn, num_workers=0))
    workers = list(build_dataloader(dataset, batches, dataset.collate_fn, num_workers=2, prefetch=1))
    assert len(workers) == len(inline) == 4
    for a, b in zip(inline, workers):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_data_json_messages(demo):
    param = copy.deepcopy(demo["param"])
    param["basic_parameters"]["max_samples"] = "10"
    with pytest.raises(DatasetConfigError, match=r"dataset_param.basic_parameters.max_samples has the wrong type. "
                                                 r"Received: str '10'; expected int or null\."):
        MultimodalDataset(param, 64)
    param = copy.deepcopy(demo["param"])
    param["basic_parameters"]["train_on_prompt"] = 1
    with pytest.raises(DatasetConfigError, match="train_on_prompt has the wrong type. Received: int 1; expected bool"):
        MultimodalDataset(param, 64)
    param = copy.deepcopy(demo["param"])
    del param["preprocess_parameters"]["model_name_or_path"]
    with pytest.raises(DatasetConfigError, match="model_name_or_path is missing"):
        MultimodalDataset(param, 64)
    param = copy.deepcopy(demo["param"])
    param["basic_parameters"]["cutoff_len"] = 512
    with pytest.raises(DatasetConfigError, match="cutoff_len is deprecated"):
        MultimodalDataset(param, 64)
    param = copy.deepcopy(demo["param"])
    param["basic_parameters"].update(templte="qwen2vl", val_rate=0.1, preprocessing_num_workers=16, max_samples=5)
    with pytest.warns(UserWarning) as caught:
        dataset = MultimodalDataset(param, 64)
    messages = [str(w.message) for w in caught]
    assert any("unknown keys templte are ignored" in m for m in messages)
    assert any("val_rate=0.1 is ignored: mmrun builds no validation set" in m for m in messages)
    assert not any("preprocessing_num_workers" in m for m in messages)  # harmless: accepted silently
    assert len(dataset) == 5


def _write_bad_dataset(directory):
    os.makedirs(directory / "imgs")
    Image.new("RGB", (60, 60), "red").save(directory / "imgs" / "good.png")
    (directory / "imgs" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    good = {"messages": [{"role": "user", "content": "<image>what"}, {"role": "assistant", "content": "red"}],
            "images": ["imgs/good.png"]}
    rows = [
        good,
        {"messages": [], "images": []},
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
        {**good, "images": ["imgs/missing.png"]},
        {**good, "images": ["imgs/corrupt.png"]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ho"}]},
    ]
    (directory / "bad.json").write_text(json.dumps(rows))
    return directory / "bad.json"


def test_bad_samples_name_file_and_index(demo, tmp_path):
    path = _write_bad_dataset(tmp_path / "ds")
    before = _listing(tmp_path)
    param = _param(demo, path, dataset_dir=str(tmp_path / "ds"))
    with pytest.raises(SampleError, match=rf"{path}: sample 1: empty or missing conversation"):
        MultimodalDataset(param, 64)
    param["basic_parameters"]["max_samples"] = 1
    assert len(MultimodalDataset(param, 64)) == 1
    param["basic_parameters"]["max_samples"] = 3
    param["basic_parameters"]["dataset"] = f"{path}"
    rows = json.loads(path.read_text())
    (tmp_path / "ds" / "two.json").write_text(json.dumps([rows[2]]))
    param["basic_parameters"]["dataset"] = str(tmp_path / "ds" / "two.json")
    with pytest.raises(SampleError, match=r"two.json: sample 0: message 1 has role 'user' where 'assistant' was "
                                          r"expected; roles must alternate"):
        MultimodalDataset(param, 64)
    (tmp_path / "ds" / "three.json").write_text(json.dumps([rows[3]]))
    param["basic_parameters"]["dataset"] = str(tmp_path / "ds" / "three.json")
    with pytest.raises(SampleError, match=r"three.json: sample 0: image 'imgs/missing.png' not found"):
        MultimodalDataset(param, 64)
    (tmp_path / "ds" / "four.json").write_text(json.dumps([rows[4]]))
    param["basic_parameters"]["dataset"] = str(tmp_path / "ds" / "four.json")
    dataset = MultimodalDataset(param, 64)  # structure is fine; the pixels are found bad when read
    with pytest.raises(SampleError, match=r"four.json: sample 0: cannot decode image .*corrupt.png"):
        dataset[0]
    (tmp_path / "ds" / "broken.json").write_text("[{")
    param["basic_parameters"]["dataset"] = str(tmp_path / "ds" / "broken.json")
    with pytest.raises(DatasetConfigError, match=r"broken.json: cannot read it as JSON"):
        MultimodalDataset(param, 64)
    (tmp_path / "ds" / "broken.json").unlink()
    for name in ("two.json", "three.json", "four.json"):
        (tmp_path / "ds" / name).unlink()
    assert _listing(tmp_path) == before  # nothing written into the dataset directory


def test_skip_bad_samples(demo, tmp_path):
    path = _write_bad_dataset(tmp_path / "ds")
    before = _listing(tmp_path)
    param = _param(demo, path, dataset_dir=str(tmp_path / "ds"))
    with pytest.warns(UserWarning, match=r"skipped 3 bad samples of 6; the first: .*sample 1: empty"):
        dataset = MultimodalDataset(param, 64, skip_bad_samples=True)
    assert len(dataset) == 3  # good, corrupt (found later), text only
    with pytest.warns(UserWarning, match="cannot decode image"):
        replaced = dataset[1]
    np.testing.assert_array_equal(replaced["input_ids"], dataset[2]["input_ids"])  # the next good sample
    assert list(dataset.skipped) == [1]
    assert _listing(tmp_path) == before


def test_truncated_image_is_an_error(demo):
    dataset = MultimodalDataset(demo["param"], seq_length=30)
    with pytest.raises(SampleError, match=r"demo.json: sample 0: the cut-off --seq-length 30 truncated the image "
                                          r"tokens \(\d+ of \d+ kept\); raise --seq-length"):
        dataset[0]


def test_video_sample_with_qwen2_5_rope(demo, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(demo["model_dir"], model)
    ids = special_token_ids_for_model_config(str(model))
    config = {"model_type": "qwen2_5_vl", "vision_config": {"spatial_merge_size": 2, "tokens_per_second": 2}, **ids}
    (model / "config.json").write_text(json.dumps(config))
    for i in range(3):
        Image.new("RGB", (84, 56), (80 * i, 0, 0)).save(tmp_path / f"f{i}.png")
    rows = [{"messages": [{"role": "user", "content": "<video>what happens"}, {"role": "assistant", "content": "red"}],
             "videos": [["f0.png", "f1.png", "f2.png"]]}]
    (tmp_path / "video.json").write_text(json.dumps(rows))
    param = _param(demo, tmp_path / "video.json", dataset_dir=str(tmp_path))
    param["preprocess_parameters"].update(model_name_or_path=str(model), video_max_pixels=10 ** 6, video_min_pixels=0)
    param["attr"]["videos"] = "videos"
    dataset = MultimodalDataset(param, seq_length=128)
    assert dataset.rope_config.tokens_per_second == 2
    sample = dataset[0]
    assert sample["video_grid_thw"].tolist() == [[2, 4, 6]]  # 3 frames + the last repeated = 2 temporal patches
    assert sample["pixel_values_videos"].shape == (48, 1176) and sample["second_per_grid_ts"].tolist() == [1.0]
    assert int((sample["input_ids"] == ids["video_token_id"]).sum()) == 12
    batch = dataset.collate_fn([sample])
    assert set(batch) == {"input_ids", "attention_mask", "labels", "position_ids", "pixel_values_videos",
                          "video_grid_thw", "second_per_grid_ts"}
    start = int(np.flatnonzero(batch["input_ids"][0] == ids["video_token_id"])[0])
    assert batch["position_ids"][0, 0, start:start + 12].tolist() == [start] * 6 + [start + 2] * 6  # 1 s * 2 tokens/s
    (model / "config.json").write_text(json.dumps({**config, "image_token_id": 99}))
    with pytest.raises(DatasetConfigError, match="config.json's image/video/vision_start token ids"):
        MultimodalDataset(param, seq_length=128)
