"""Qwen2.5-Omni's data path (template qwen2_omni, MindSpeed-MM's data_7b.json as it is): audio blocks and Whisper
features per sample, a video interleaved with its sound track (use_audio_in_video), TMRoPE positions from the
collator equal to transformers' get_rope_index, and one-line refusals of bad audio."""
from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import numpy as np
import pytest

from mmrun.data.audio.features import WhisperFeatures
from mmrun.data.audio.reader import read_audio
from mmrun.data.multimodal.mllm_dataset import MultimodalDataset, SampleError

JOB = Path(__file__).resolve().parents[1] / "training" / "omni_job.py"
AUDIO, AUDIO_BOS, AUDIO_EOS, VISION_BOS, VISION_EOS, VIDEO = 151646, 151647, 151648, 151652, 151653, 151656


def _job_module():
    spec = importlib.util.spec_from_file_location("mmrun_tests_omni_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dataset(root: Path, use_audio_in_video: bool) -> MultimodalDataset:
    pytest.importorskip("av")
    paths = _job_module().make_job(root, samples=4, use_audio_in_video=use_audio_in_video)
    return MultimodalDataset(json.loads(paths["data_json"].read_text())["dataset_param"], seq_length=1024)


def _hf_positions(dataset, batch) -> np.ndarray:
    """transformers' Qwen2.5-Omni get_rope_index on the batch (the thinker's method on a stand-in holding its config)."""
    torch = pytest.importorskip("torch")
    omni = pytest.importorskip("transformers.models.qwen2_5_omni.modeling_qwen2_5_omni")
    rope = dataset.rope_config
    config = types.SimpleNamespace(image_token_id=rope.image_token_id, video_token_id=rope.video_token_id,
                                   audio_token_id=rope.audio_token_id, vision_start_token_id=rope.vision_start_token_id,
                                   audio_start_token_id=rope.audio_start_token_id,
                                   position_id_per_seconds=rope.position_id_per_seconds,
                                   seconds_per_chunk=rope.seconds_per_chunk)
    cls = omni.Qwen2_5OmniPreTrainedModelForConditionalGeneration
    holder = types.SimpleNamespace(config=config, spatial_merge_size=rope.spatial_merge_size)
    holder.get_llm_pos_ids_for_vision = cls.get_llm_pos_ids_for_vision.__get__(holder)
    holder.get_chunked_index = cls.get_chunked_index.__get__(holder)
    t = {k: torch.from_numpy(v) for k, v in batch.items()}
    positions, _ = cls.get_rope_index(holder, t["input_ids"], t.get("image_grid_thw"), t.get("video_grid_thw"),
                                      t["attention_mask"], rope.use_audio_in_video,
                                      t["feature_attention_mask"].sum(-1), t.get("second_per_grid_ts"))
    return positions.numpy()


def test_audio_samples_hold_their_audio_block_and_whisper_features(tmp_path):
    dataset = _dataset(tmp_path, use_audio_in_video=False)
    sample = dataset[0]
    wave = read_audio(tmp_path / "data" / "audio" / "0.wav")
    expected, frames = WhisperFeatures(feature_size=16).features(wave, 16000)
    np.testing.assert_array_equal(sample["input_features"][0], expected)
    assert sample["feature_attention_mask"].sum() == frames == 50  # 0.5 s at 100 frames a second
    ids = sample["input_ids"].tolist()
    start = ids.index(AUDIO_BOS)
    assert ids[start + 1:start + 13] == [AUDIO] * 12 and ids[start + 13] == AUDIO_EOS  # (50 - 1) // 2 + 1 = 25 -> 12
    video = dataset[3]  # a video beside its sound track, each its own block without use_audio_in_video
    ids = video["input_ids"].tolist()
    assert ids[ids.index(VISION_BOS):ids.index(VISION_EOS) + 2] == [VISION_BOS] + [VIDEO] * 4 + [VISION_EOS, AUDIO_BOS]
    batch = dataset.collate_fn([dataset[i] for i in range(4)])
    assert batch["input_features"].shape[0] == 4 and batch["feature_attention_mask"].sum() == 50 + 75 + 100 + 125
    np.testing.assert_array_equal(batch["position_ids"], _hf_positions(dataset, batch))


def test_a_video_and_its_sound_track_interleave_by_chunks(tmp_path):
    dataset = _dataset(tmp_path, use_audio_in_video=True)
    video = dataset[3]
    ids = video["input_ids"].tolist()
    block = ids[ids.index(VISION_BOS):ids.index(VISION_EOS) + 1]
    # 2 frames at 2 fps: one temporal step (time 0), 4 tokens; 1.25 s of sound: 31 tokens, positions 0..30, all in
    # the first 2-second chunk (50 positions): video chunk, then audio chunk
    assert block == [VISION_BOS, AUDIO_BOS] + [VIDEO] * 4 + [AUDIO] * 31 + [AUDIO_EOS, VISION_EOS]
    batch = dataset.collate_fn([dataset[2], video])
    np.testing.assert_array_equal(batch["position_ids"], _hf_positions(dataset, batch))


def test_bad_audio_is_a_one_line_error_naming_the_sample(tmp_path):
    dataset = _dataset(tmp_path, use_audio_in_video=True)
    (tmp_path / "data" / "audio" / "1.wav").write_bytes(b"RIFF....WAVEfmt garbage")
    with pytest.raises(SampleError, match=r"omni.json: sample 1: audio file .*1.wav will not decode as audio") as error:
        dataset[1]
    assert "\n" not in str(error.value)
    records = json.loads((tmp_path / "data" / "omni.json").read_text())
    records[3]["messages"][0]["content"] = "<audio><video>What do you hear?"  # the sound track before its video
    (tmp_path / "data" / "omni.json").write_text(json.dumps(records))
    dataset = MultimodalDataset(json.loads((tmp_path / "data.json").read_text())["dataset_param"], seq_length=1024)
    with pytest.raises(SampleError, match=r"sample 3: with use_audio_in_video each <video> must be followed by an "
                                          r"<audio>"):
        dataset[3]


def test_audio_with_a_template_that_takes_none_is_refused(tmp_path):
    from mmrun.data.gpt_dataset import DatasetConfigError

    pytest.importorskip("av")
    paths = _job_module().make_job(tmp_path, samples=2)
    param = json.loads(paths["data_json"].read_text())["dataset_param"]
    param["basic_parameters"]["template"] = "qwen2vl"
    with pytest.raises(DatasetConfigError, match=r"attr.audios is 'audios' but the qwen2vl template takes no audio"):
        MultimodalDataset(param, seq_length=1024)


def _video_file_job(root: Path, **preprocess) -> Path:
    """make_job's dataset with sample 3's video a video file (3 s, 12 frames at 4 fps, a 440 Hz sound track) listed
    without audios: use_audio_in_video reads the file's own sound."""
    pytest.importorskip("av")
    job = _job_module()
    job.make_job(root, samples=4, use_audio_in_video=True)
    job.write_video_with_sound(root / "data" / "clip.mp4")
    records = json.loads((root / "data" / "omni.json").read_text())
    records[3].update(videos=["clip.mp4"], audios=[])
    records[3]["messages"][0]["content"] = "<video>What do you hear?"
    (root / "data" / "omni.json").write_text(json.dumps(records))
    data = json.loads((root / "data.json").read_text())
    data["dataset_param"]["preprocess_parameters"].update(preprocess)
    (root / "data.json").write_text(json.dumps(data))
    return root / "data.json"


def test_a_video_file_gives_its_frames_and_its_own_sound_track(tmp_path):
    import av

    from mmrun.data.multimodal.image_processing import preprocess_video, regularize_image

    dataset = MultimodalDataset(json.loads(_video_file_job(tmp_path).read_text())["dataset_param"], seq_length=1024)
    sample = dataset[3]
    # MindSpeed-MM's sampling: floor(3 s x video_fps 2) = 6 frames, linspace(0, 11, 6) -> 0 2 4 6 8 11; rate 6 / 3 s
    with av.open(str(tmp_path / "data" / "clip.mp4")) as container:
        frames = [f.to_image() for i, f in enumerate(container.decode(video=0)) if i in (0, 2, 4, 6, 8, 11)]
    expected, grid = preprocess_video([regularize_image(f, 16384, 0) for f in frames], dataset.video_config)
    np.testing.assert_array_equal(sample["pixel_values_videos"], expected)
    assert sample["video_grid_thw"].tolist() == grid.tolist() == [[3, 4, 4]]
    assert sample["second_per_grid_ts"].tolist() == [1.0]  # temporal_patch_size 2 / 2.0 frames a second
    wave = read_audio(tmp_path / "data" / "clip.mp4", what="video")
    features, frames_kept = WhisperFeatures(feature_size=16).features(wave, 16000)
    np.testing.assert_array_equal(sample["input_features"][0], features)
    assert sample["feature_attention_mask"].sum() == frames_kept > 300  # about 3 s of sound
    ids = sample["input_ids"].tolist()
    block = ids[ids.index(VISION_BOS):ids.index(VISION_EOS) + 1]
    assert block[:3] == [VISION_BOS, AUDIO_BOS, VIDEO] and block.count(VIDEO) == 12  # video and sound interleaved
    batch = dataset.collate_fn([dataset[2], sample])
    np.testing.assert_array_equal(batch["position_ids"], _hf_positions(dataset, batch))


@pytest.mark.parametrize("change, words", [
    ({"silent": True}, r"sample 3: video file .*clip.mp4 has no audio track \(use_audio_in_video"),
    ({"audio_sampling_rate": 8000}, r"sample 3: audio 0: sampled at 8000 Hz, but the feature extractor takes 16000 Hz"),
    ({"chunk_length": 2}, r"sample 3: audio 0: 3.\d+ s long, above the extractor's limit of 2 s \(chunk_length\)"),
    ({"broken": True}, r"sample 3: video file .*clip.mp4 will not decode"),
])
def test_a_video_file_that_cannot_give_its_sound_is_one_line(tmp_path, change, words):
    data_json = _video_file_job(tmp_path, **{k: v for k, v in change.items() if k == "audio_sampling_rate"})
    clip = tmp_path / "data" / "clip.mp4"
    if "silent" in change:
        _job_module().write_video_with_sound(clip, hertz=None)
    if "broken" in change:
        clip.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 20)
    if "chunk_length" in change:
        processor = tmp_path / "model" / "preprocessor_config.json"
        processor.write_text(json.dumps({**json.loads(processor.read_text()), "chunk_length": change["chunk_length"]}))
    dataset = MultimodalDataset(json.loads(data_json.read_text())["dataset_param"], seq_length=1024)
    with pytest.raises(SampleError, match=words) as error:
        dataset[3]
    assert "\n" not in str(error.value)
